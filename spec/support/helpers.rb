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
end

AMQP_URL = AceMQSpecHelpers::AMQP_URL unless defined?(AMQP_URL)
DATABASE_URL = AceMQSpecHelpers::DATABASE_URL unless defined?(DATABASE_URL)
