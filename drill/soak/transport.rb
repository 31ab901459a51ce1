# frozen_string_literal: true

require_relative "support"
require_relative "probe"
require_relative "paths"

module Soak
  # Raised in the main thread when a path outlives its limit: not a
  # StandardError, so no path can take it for one of its own outcomes.
  class Hang < Exception; end # rubocop:disable Lint/InheritException

  # Bounds on the main thread's waits: past a limit the main thread is
  # interrupted with a Hang saying where it was (every wait in the engine
  # lets Ruby's interrupts in within 200 ms). One thread for the whole run,
  # so that it is in every count of threads the soak takes, not in some.
  class Watchdog
    def initialize(main = Thread.current)
      @main = main
      @lock = Mutex.new
      @limits = []
      @thread = Thread.new do
        loop do
          sleep 0.2
          check
        end
      end
      @thread.name = "soak watchdog"
    end

    # Run the block within limit seconds (limits nest: the innermost that
    # runs out fires).
    def bounded(limit, what)
      entry = [Soak.now + limit, what, limit]
      @lock.synchronize { @limits.push(entry) }
      yield
    ensure
      @lock.synchronize { @limits.delete(entry) }
    end

    def stop
      @thread.kill
      @thread.join
    end

    private

    def check
      due = @lock.synchronize do
        e = @limits.find { |deadline, _, _| Soak.now > deadline }
        @limits.delete(e) if e
        e
      end
      return unless due

      where = @main.backtrace&.first(6)&.join("\n    ")
      @main.raise(Hang, "#{due[1]}: still running after #{due[2].round}s, at\n    #{where}")
    end
  end

  def self.watchdog = @watchdog ||= Watchdog.new

  def self.bounded(limit, what, &block) = watchdog.bounded(limit, what, &block)

  # The good traffic between failures: a queue with a subscription that
  # runs for the whole transport, and a publish to it every GOOD_EVERY
  # failed operations. Every one must arrive.
  class Good
    attr_reader :published, :errors, :sub

    def initialize(mq)
      @mq = mq
      @queue = Soak.name("good")
      AMQP::Topology.new.queue(@queue).apply(mq)
      @seen = Hash.new(0)
      @lock = Mutex.new
      @published = 0
      @errors = []
      @sub = mq.consume(@queue, concurrency: 2) do |m|
        @lock.synchronize { @seen[m.payload["seq"]] += 1 }
        AMQP::Ack.accept
      end
    end

    def publish
      seq = @published + 1
      @mq.publish({ "seq" => seq }, to: @queue)
      @published = seq
    rescue StandardError => e
      @published = seq # counted: a good publish that raised is a failure, and its message is not expected
      @errors << "good publish #{seq}: #{e.class}: #{e.message}"
      @missing_ok = (@missing_ok || []) << seq
    end

    # [missing seqs, duplicated seqs] once everything published has had up
    # to limit seconds to arrive.
    def account(limit = 10)
      want = (1..@published).to_a - (@missing_ok || [])
      Soak.poll(limit) { @lock.synchronize { want.all? { |s| @seen.key?(s) } } }
      @lock.synchronize { [want.reject { |s| @seen.key?(s) }, @seen.select { |_, c| c > 1 }.keys] }
    end

    def close
      @sub.cancel
      AMQP::Topology.new.queue(@queue).teardown(@mq, force: true)
    end
  end

  # What one path did.
  Row = Struct.new(:transport, :key, :title, :n, :ops, :counts, :before, :after, :peak, :settle, :round_trip, :seconds,
                   :failures, :notes, :skipped, keyword_init: true) do
    def ok? = skipped || failures.empty?
  end

  # Every path, on one connection to url.
  class TransportRun
    attr_reader :rows, :failures, :label

    # sizes: { path key => N }; limit: seconds a path may take.
    def initialize(label:, url:, broker:, sizes:, limit:, rss_limit_mb:, long: false)
      @label = label
      @url = url
      @broker = broker
      @sizes = sizes
      @limit = limit
      @rss_limit_mb = rss_limit_mb
      @long = long
      @rows = []
      @failures = []
    end

    def origin = @origin ||= "soak-#{Process.pid}-#{SecureRandom.hex(3)}-#{@label}"

    def open
      @mq = AMQP::Connection.open(@url, origin: origin, connect_timeout: 5, confirm_timeout: 10)
      @probe = Probe.new(@mq, origin: origin, broker: @broker)
      @good = Good.new(@mq)
      @good.publish # the publishing channel is open in every reading, this one too
      @ctx = Context.new(mq: @mq, url: @url, broker: @broker, origin: origin, good: @good, long: @long)
      @connection_pid = @probe.connection_pid
      if @broker && !@connection_pid
        raise Drill::Failure, "the broker lists no connection named #{origin}: cannot count its channels"
      end
      # 15 samples (3.5 s) agreeing on everything: the thread cache empty.
      @start = steady(samples: 15, counted: Probe::LOCAL)
      @start.broker = @probe.broker_channels
      @broker_channels = @start.broker
      @resubscriptions = 0
      Soak.say "#{@label}: connection #{origin}#{@connection_pid && " (broker pid #{@connection_pid})"}; " \
               "start: #{Soak.describe(@start)}"
    end

    attr_reader :mq, :probe, :ctx, :good

    def call
      open
      PATHS.each { |klass| @rows << run_path(klass) }
      yield self if block_given? # the long mode's mixed traffic
      finish
      self
    ensure
      begin
        @good&.close
      rescue StandardError => e
        @failures << "closing the good traffic: #{e.class}: #{e.message}"
      end
      @mq&.close
    end

    # A sample once what a path ended has gone: a cancelled subscription's
    # last task (its deadline watch sleeps up to 1 s), a channel being
    # closed. `samples` in a row, a quarter second apart, must agree on the
    # channels and tasks. Threads and descriptors are judged against the
    # connection's start instead (see #run_path): they belong to connections
    # and the runtime, never to one path, and the native thread of a Ruby
    # thread that ended lingers about 3 s in Ruby 3.1's thread cache.
    # Seven samples 0.25 s apart: longer than a retired publishing
    # channel's second of grace, so the warm-up's retired channels are not
    # in the baseline.
    def steady(samples: 7, counted: %i[channels tasks])
      seen = []
      Soak.poll(STEADY_LIMIT, interval: 0.25) do
        seen << @probe.sample(broker: false)
        seen.shift while seen.size > samples
        seen.size == samples && seen.map { |x| x.to_h.slice(*counted) }.uniq.size == 1
      end
      seen.last
    end

    STEADY_LIMIT = 15

    def run_path(klass)
      n = @sizes.fetch(klass.key)
      path = klass.new(@ctx, n)
      row = Row.new(transport: @label, key: klass.key, title: klass::TITLE, n: n, ops: 0, counts: {}, failures: [],
                    notes: [])
      if (why = path.skip_reason)
        row.skipped = why
        Soak.say format("%-9s %-50s skipped: %s", @label, klass::TITLE, why)
        return row
      end

      t = Soak.now
      published = @good.published
      errors = @good.errors.size
      begin
        Soak.bounded(@limit, "#{@label} #{klass.key}") do
          lap = Soak.now
          laps = {}
          mark = ->(k) { laps[k] = (Soak.now - lap).round(2); lap = Soak.now }
          path.prepare
          path.warm_up
          mark[:warm]
          # A good publish before each reading: the publishing channel is
          # opened by the first publish after a failure closed it, so it is
          # open in both.
          @good.publish
          row.before = steady
          row.before.fds = @start.fds
          row.before.threads = @start.threads
          row.before.broker = @broker_channels
          mark[:steady]
          path.start
          peak = 0
          (n.to_f / path.batch).ceil.times do |i|
            path.attempt(i)
            peak = [peak, @mq.resources.channels].max
            @good.publish while @good.published - published < path.ops / GOOD_EVERY
          end
          row.peak = peak
          mark[:ops]
          path.stop
          mark[:stop]
          @good.publish
          row.after, row.settle = @probe.settle(row.before)
          mark[:settle]
          Soak.say "    laps: #{laps}" if ENV["SOAK_DEBUG"]
        end
      rescue Hang => e
        row.failures << "hung: #{e.message}"
        row.after ||= @probe.sample
      rescue StandardError => e
        row.failures << "#{e.class}: #{e.message} (at #{e.backtrace&.first})"
        row.after ||= @probe.sample
      end
      row.ops = path.ops
      row.counts = path.counts.dup
      row.failures.concat(path.failures)
      row.notes.concat(path.notes)
      judge(row, path)
      row.failures.concat(@good.errors[errors..])
      row.round_trip = round_trip
      row.failures << "the round trip after it failed: #{row.round_trip[1]}" unless row.round_trip[0]
      begin
        path.cleanup
      rescue StandardError => e
        row.notes << "cleanup: #{e.class}: #{e.message}"
      end
      row.seconds = Soak.now - t
      Soak.say Soak.row_line(row)
      row.failures.each { |f| Soak.say "    FAILED: #{f}" }
      row.notes.each { |f| Soak.say "    note: #{f}" }
      row
    end

    # Every message between failures is a good publish: one every 50 failed
    # operations.
    GOOD_EVERY = 50

    def judge(row, path)
      path.wrong.each do |label, text|
        row.failures << "#{row.counts[label]} × #{label} where #{path.expect.join(' or ')} was expected; first: #{text[0, 300]}"
      end
      return unless row.before && row.after

      Probe.excess(row.after, row.before).each do |k, (b, a)|
        row.failures << "#{k} grew from #{b} to #{a} (tolerance +#{TOLERANCE[k]}, after #{row.settle&.round(1)}s to settle)"
      end
      if @broker
        if row.after.broker != row.after.channels && (was, now = @probe.replaced)
          row.failures << "the connection was replaced: the broker lists it as #{now}, no longer #{was}"
          @replaced = true
          row.after.broker = Soak.poll(BROKER_SETTLE, interval: 0.2) { (n = @probe.broker_channels) == row.after.channels && n } ||
                             @probe.broker_channels
        end
        if row.after.broker.nil?
          row.failures << "the broker no longer lists connection #{origin} (lost?)"
        elsif row.after.broker != row.after.channels
          row.failures << "the broker lists #{row.after.broker} channels for the connection where the client holds " \
                          "#{row.after.channels} (after #{BROKER_SETTLE}s)"
        end
        @broker_channels = row.after.broker
      end
      if (n = @good.sub.resubscriptions) > @resubscriptions
        row.failures << "the good traffic's subscription lost its channel and subscribed again (#{n - @resubscriptions} " \
                        "times): #{@good.sub.failure || 'no failure recorded'}"
        @resubscriptions = n
      end
      grown = row.after.rss_mb - row.before.rss_mb
      return unless grown > @rss_limit_mb

      row.failures << format("RSS grew %.1f MB (limit %d MB)", grown, @rss_limit_mb)
    end

    # Declare a fresh queue, publish, consume it back and acknowledge it, on
    # the same connection: [passed, what went wrong, seconds].
    def round_trip
      t = Soak.now
      q = Soak.name("roundtrip")
      topology = AMQP::Topology.new.queue(q)
      got = Queue.new
      sub = nil
      begin
        Soak.bounded(30, "the round trip") do
          @mq.apply(topology)
          id = @mq.publish({ "check" => q }, to: q).id
          sub = @mq.consume(q) do |m|
            got << [m.id, m.payload["check"]]
            AMQP::Ack.accept
          end
          back = Soak.poll(10, interval: 0.01) { got.empty? ? nil : got.pop }
          return [false, "published #{id}, nothing came back within 10s", Soak.now - t] unless back
          return [false, "came back as #{back.inspect}, not [#{id}, #{q}]", Soak.now - t] unless back == [id, q]

          sub.cancel
          left = @mq.queue_counts(q)
          return [false, "the queue holds #{left.inspect} after the accept", Soak.now - t] unless left && left[:ready].zero?
        end
        [true, nil, Soak.now - t]
      rescue Hang, StandardError => e
        [false, "#{e.class}: #{e.message}", Soak.now - t]
      ensure
        begin
          sub&.cancel
          topology.teardown(@mq, force: true)
        rescue StandardError
          nil
        end
      end
    end

    # After every path: the good traffic all arrived, once; the standing
    # subscription never lost its channel; the connection is the one opened.
    def finish
      missing, doubled = @good.account
      @failures << "good traffic: #{missing.size} of #{@good.published} lost (seq #{missing.first(10).join(', ')})" unless missing.empty?
      @failures << "good traffic: #{doubled.size} delivered twice (seq #{doubled.first(10).join(', ')})" unless doubled.empty?
      # What a path's row has not said already.
      if (n = @good.sub.resubscriptions) > @resubscriptions
        @failures << "the good traffic's subscription lost its channel #{n - @resubscriptions} times: " \
                     "#{@good.sub.failure || 'no failure recorded'}"
      end
      if @broker && !@replaced && (now = @probe.current_connection_pid) != @connection_pid
        @failures << "the connection is not the one opened (broker pid #{@connection_pid.inspect}, now #{now.inspect}): " \
                     "it was replaced or lost"
      end
      @end = steady(samples: 15, counted: Probe::LOCAL)
      @end.broker = @probe.broker_channels
      Probe.excess(@end, @start, %i[fds threads]).each do |k, (b, a)|
        @failures << "#{k} grew from #{b} at the start to #{a} at the end (tolerance +#{TOLERANCE[k]})"
      end
      Soak.say "#{@label}: end: #{Soak.describe(@end)}; good traffic: #{@good.published} published, " \
               "#{@good.published - missing.size} arrived"
    end

    def good_published = @good.published
    attr_reader :start
  end

  def self.describe(s)
    [("channels #{s.channels}" if s.channels), ("broker channels #{s.broker}" if s.broker), "fds #{s.fds}",
     "threads #{s.threads}", "tasks #{s.tasks}", format("RSS %.1f MB", s.rss_mb)].compact.join(", ")
  end

  ROW = "%-9s %-46s %6s  %-7s %5s  %-7s %-7s %-7s %-7s %-9s %-4s %6s  %s"

  def self.header
    format(ROW, "transport", "path", "ops", "channels", "peak", "broker", "fds", "threads", "tasks", "RSS MB", "trip",
           "secs", "outcomes")
  end

  def self.row_line(r)
    return format("%-9s %-46s skipped: %s", r.transport, r.title, r.skipped) if r.skipped

    pair = ->(k) { r.before && r.after && !r.before[k].nil? ? "#{r.before[k]}→#{r.after[k]}" : "-" }
    rss = r.before && r.after ? format("%.0f→%.0f", r.before.rss_mb, r.after.rss_mb) : "-"
    outcomes = r.counts.sort_by { |_, c| -c }.map { |l, c| "#{l} #{c}" }.join(", ")
    format(ROW, r.transport, r.title[0, 46], r.ops, pair[:channels], r.peak || "-", pair[:broker], pair[:fds], pair[:threads],
           pair[:tasks], rss, r.round_trip&.first ? "ok" : "FAIL", format("%.1f", r.seconds.to_f), outcomes) +
      (r.ok? ? "" : "  << FAILED")
  end
end
