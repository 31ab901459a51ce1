# frozen_string_literal: true

module AceMQSpecHelpers
  AMQP_URL = ENV.fetch("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
  DATABASE_URL = ENV.fetch("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
  # MariaDB 10.11 here; MySQL 8.0 is the other server the mysql dialect is for.
  MYSQL_URL = ENV.fetch("MYSQL_URL", "mysql2://root@127.0.0.1:3306/test")

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

  # A backtrace frame "LOCATION:in `METH'" as Ruby before 3.4 writes it, or
  # "LOCATION:in 'Owner#METH'" as 3.4 does: a regexp matching the line's start.
  def frame(location, meth)
    prefix = location ? "\\A#{Regexp.escape(location)}:" : ""
    /#{prefix}in [`'](?:[^' ]*[#.])?#{Regexp.escape(meth)}'/
  end

  # Every name `unique` handed out this run: the queues named from them
  # (and their .dlq and .retry.* rungs) are deleted after the suite.
  NAMED = Queue.new

  # A name no other example (or earlier run) uses.
  def unique(prefix = "spec")
    "#{prefix}-#{SecureRandom.hex(6)}".tap { |name| NAMED << name }
  end

  # Delete the shared broker's queues named from this run's unique names,
  # so runs do not pile queues up on it (one run names about 700). Only
  # names this process made: another run's queues are never touched.
  def self.delete_named_queues
    names = []
    names << NAMED.pop until NAMED.empty?
    return 0 if names.empty?

    delete_idle_queues { |q| names.any? { |n| q == n || q.start_with?("#{n}.") } }
  end

  # The same after `cargo test` (Rakefile): the Rust tests name their queues
  # with a UUIDv7, whose first 48 bits are the millisecond it was made, so a
  # queue named between from_ms and to_ms is one of theirs.
  def self.delete_queues_named_between(from_ms, to_ms)
    delete_idle_queues do |q|
      q.scan(/\h{8}-?\h{4}-?7\h{3}-?\h{4}-?\h{12}/).any? { |u| (from_ms..to_ms).cover?(u.delete("-")[0, 12].to_i(16)) }
    end
  end

  # Delete the queues with no consumer that the block picks; how many.
  # Nothing (0) where rabbitmqctl cannot list them.
  def self.delete_idle_queues
    listing = IO.popen(%w[rabbitmqctl list_queues -q --no-table-headers name consumers], err: File::NULL, &:read)
    return 0 unless $?.success?

    ours = listing.lines.map { |l| l.chomp.split("\t") }.select { |q, consumers| consumers.to_i.zero? && yield(q) }.map(&:first)
    return 0 if ours.empty?

    on_broker { |bunny| delete_on(bunny, queues: ours) }
    ours.size
  rescue LoadError => e
    # Ruby 3.4 in the sid stage: Debian builds Bunny's rbtree for 3.3 only.
    # That stage's broker is its own and goes with it, so nothing piles up.
    warn "spec cleanup: #{ours&.size || 0} queues left on the broker (#{e.message.lines.first.strip})"
    0
  rescue SystemCallError, Bunny::Exception
    0
  end

  # Delete these exchanges on the shared broker (missing ones are skipped).
  def self.delete_exchanges(names)
    on_broker { |bunny| delete_on(bunny, exchanges: names) }
  rescue LoadError
    nil # no Bunny on this Ruby (3.4): see delete_idle_queues
  rescue SystemCallError, Bunny::Exception
    nil
  end

  # A Bunny connection to the shared broker for the block, closed after.
  def self.on_broker
    require "bunny"
    require "logger"
    bunny = Bunny.new(AMQP_URL, logger: Logger.new(nil))
    bunny.start
    yield bunny
  ensure
    bunny&.close
  end

  # Delete queues and exchanges through `bunny`, skipping what is already
  # gone (a 404 closes the channel; the next name gets a new one).
  def self.delete_on(bunny, queues: [], exchanges: [])
    ch = bunny.create_channel
    (queues.map { |q| [:queue_delete, q] } + exchanges.map { |x| [:exchange_delete, x] }).each do |op, name|
      ch = bunny.create_channel unless ch.open?
      ch.public_send(op, name)
    rescue StandardError
      nil
    end
  end

  def memory_url
    "memory://#{unique('broker')}"
  end

  # The shared broker closes every connection whose name starts with origin
  # (its origin): how the specs make the broker go away without stopping it.
  # pids: listed beforehand, for a close that must land at a chosen moment
  # (each rabbitmqctl takes a second or two on a loaded machine).
  def broker_closes_connections(origin, pids: broker_connection_pids(origin))
    pids.each { |pid| system("rabbitmqctl", "close_connection", pid, "spec: the broker went away", out: File::NULL) }
    pids.size
  end

  # The broker's pids of the connections whose name starts with origin.
  def broker_connection_pids(origin)
    listing = `rabbitmqctl list_connections pid client_properties 2>/dev/null`
    pids = listing.lines.select { |l| l.include?(%({"connection_name","#{origin})) }.map { |l| l.split("\t").first }
    raise "no connection named #{origin}*" if pids.empty?

    pids
  end
end

AMQP_URL = AceMQSpecHelpers::AMQP_URL unless defined?(AMQP_URL)
DATABASE_URL = AceMQSpecHelpers::DATABASE_URL unless defined?(DATABASE_URL)
