# frozen_string_literal: true

module AceMQSpecHelpers
  AMQP_URL = ENV.fetch("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
  DATABASE_URL = ENV.fetch("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")

  # Poll until the block returns truthy; fail after timeout seconds with the
  # last value. Never a bare sleep.
  def eventually(timeout: 5, interval: 0.02)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    loop do
      value = yield
      return value if value

      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        raise RSpec::Expectations::ExpectationNotMetError, "condition not met within #{timeout}s (last: #{value.inspect})"
      end

      sleep interval
    end
  end

  # A name no other example (or earlier run) uses.
  def unique(prefix = "spec")
    "#{prefix}-#{SecureRandom.hex(6)}"
  end

  def memory_url
    "memory://#{unique('broker')}"
  end

  # The shared broker closes every connection whose name starts with origin
  # (its origin): how the specs make the broker go away without stopping it.
  def broker_closes_connections(origin)
    listing = `rabbitmqctl list_connections pid client_properties 2>/dev/null`
    pids = listing.lines.select { |l| l.include?(%({"connection_name","#{origin})) }.map { |l| l.split("\t").first }
    raise "no connection named #{origin}*" if pids.empty?

    pids.each { |pid| system("rabbitmqctl", "close_connection", pid, "spec: the broker went away", out: File::NULL) }
    pids.size
  end
end

AMQP_URL = AceMQSpecHelpers::AMQP_URL unless defined?(AMQP_URL)
DATABASE_URL = AceMQSpecHelpers::DATABASE_URL unless defined?(DATABASE_URL)
