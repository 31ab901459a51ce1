# frozen_string_literal: true

require_relative "support"

module Soak
  AMQP = AceMQ::AMQP

  # What a path runs with: the one connection, its URL (for a path that
  # opens connections of its own), the private node (nil on memory://) and
  # the good traffic that goes on between failures.
  Context = Struct.new(:mq, :url, :broker, :origin, :good, :long, keyword_init: true) do
    def memory? = url.start_with?("memory://")
  end

  # A handler's own failure: raised on purpose, so never mistaken for one of
  # the engine's errors.
  class HandlerError < StandardError; end

  # One error path. A subclass says what one operation is (#op, which
  # returns a label for what came back or raises), which labels are right
  # (EXPECT), and may declare what it needs (#prepare), start something
  # after the baseline is taken (#start), wait for what is in flight before
  # the resources are read again (#stop) and remove what it declared
  # (#cleanup). Every outcome is counted by label: an error by its class's
  # name, anything else by what #op returned.
  class Path
    attr_reader :ctx, :n, :counts, :wrong, :failures, :notes, :ops

    def self.key = name.split("::").last.gsub(/([a-z])([A-Z])/, '\1_\2').downcase

    def initialize(ctx, n)
      @ctx = ctx
      @n = n
      @counts = Hash.new(0)
      @wrong = {}
      @failures = []
      @notes = []
      @ops = 0
    end

    def mq = ctx.mq
    def title = self.class::TITLE
    def expect = self.class::EXPECT

    # Why this path means nothing on this transport, or nil.
    def skip_reason = nil

    def prepare; end
    def start; end
    def stop; end
    def cleanup; end

    # The first few operations, before the baseline: whatever the first of
    # a kind starts once (a publishing channel, the reply channel, a task)
    # is in the baseline, and what is measured is what N more cost.
    def warm_up(count = 3)
      start
      count.times { |i| attempt(-1 - i) }
      stop
    rescue StandardError
      nil
    ensure
      reset
    end

    def reset
      @counts.clear
      @wrong.clear
      @failures.clear
      @notes.clear
      @ops = 0
    end

    # One operation, counted.
    def attempt(i)
      @ops += 1
      label = begin
        op(i)
      rescue StandardError => e
        @last_error = e
        e.class.name.split("::").last
      end
      @counts[label] += 1
      return if expect.include?(label)

      @wrong[label] ||= @last_error ? "#{@last_error.class}: #{@last_error.message}" : label
    ensure
      @last_error = nil
    end

    # Operations one #attempt makes.
    def batch = 1

    def queue(what) = Soak.name("#{self.class.key}.#{what}")
  end

  # A passive declare of a queue that does not exist: the broker closes the
  # channel it was asked on (404), and queue_counts answers nil.
  class MissingQueue < Path
    TITLE = "queue_counts of a missing queue"
    EXPECT = ["nil"].freeze

    def prepare = @missing = queue("missing")
    def op(_i) = mq.queue_counts(@missing).nil? ? "nil" : "counts"
  end

  # The passive declare of a missing exchange: a connection checks an
  # exchange on a channel of its own before the first publish to it, and
  # that check is how AceMQ asks whether an exchange exists. Its answer for
  # a missing one is not remembered, so every publish asks again.
  class MissingExchange < Path
    TITLE = "publish to a missing exchange (its passive check)"
    EXPECT = ["NotFound"].freeze

    def prepare = @missing = queue("missing")
    def op(i) = mq.publish({ "n" => i }, to: "anything", exchange: @missing) && "published"
  end

  # A binding to a missing exchange: queue.bind refused with 404, which
  # closes the declaring channel after the queue and its DLQ were declared.
  class BindMissingExchange < Path
    TITLE = "bind a queue to a missing exchange"
    EXPECT = ["NotFound"].freeze

    def prepare
      @q = queue("q")
      @topology = AMQP::Topology.new.queue(@q).bind(@q, to: queue("missing"))
    end

    def op(_i) = mq.apply(@topology) && "declared"
    def cleanup = AMQP::Topology.new.queue(@q).teardown(mq, force: true)
  end

  # A mandatory publish nothing is bound to take: the broker returns it.
  class Unroutable < Path
    TITLE = "unroutable publish (mandatory)"
    EXPECT = ["Unroutable"].freeze

    def prepare = @nobody = queue("nobody")
    def op(i) = mq.publish({ "n" => i }, to: @nobody) && "published"
  end

  # A publish to a full queue that rejects publishes: the broker nacks it.
  class Nacked < Path
    TITLE = "publish nacked (x-overflow reject-publish)"
    EXPECT = ["PublishNacked"].freeze

    def skip_reason = ctx.memory? && "memory:// has no x-max-length or x-overflow (docs/testing.md lists what it has)"

    def prepare
      @q = queue("full")
      AMQP::Topology.new.queue(@q, arguments: { "x-max-length" => 1, "x-overflow" => "reject-publish" }).apply(mq)
      mq.publish({ "fill" => true }, to: @q)
    end

    def op(i) = mq.publish({ "n" => i }, to: @q) && "published"
    def cleanup = AMQP::Topology.new.queue(@q).teardown(mq, force: true)
  end

  # A body over the broker's max_message_size (1 MiB on the soak's node):
  # RabbitMQ closes the channel with 406 PRECONDITION_FAILED.
  class Oversized < Path
    TITLE = "oversized publish (over max_message_size)"
    EXPECT = ["PreconditionFailed"].freeze
    BODY = "x" * (1_048_576 + 1)

    def skip_reason = ctx.memory? && "memory:// has no max_message_size"

    def prepare
      @q = queue("big")
      AMQP::Topology.new.queue(@q).apply(mq)
    end

    def op(_i) = mq.publish(BODY, to: @q) && "published"
    def cleanup = AMQP::Topology.new.queue(@q).teardown(mq, force: true)
  end

  # A publish the user may not make (write permission refused on
  # soak.denied): 403 ACCESS_REFUSED, which closes the channel.
  class Denied < Path
    TITLE = "publish refused by permissions (403)"
    EXPECT = ["AccessRefused"].freeze

    def skip_reason = ctx.memory? && "memory:// has no users or permissions"
    def op(i) = mq.publish({ "n" => i }, to: "k", exchange: Broker::DENIED) && "published"
  end

  # A queue declared again with other arguments: 406, naming the argument.
  class Precondition < Path
    TITLE = "redeclare a queue with other arguments"
    EXPECT = ["PreconditionFailed"].freeze

    def prepare
      @q = queue("q")
      AMQP::Topology.new.queue(@q, arguments: { "x-max-length" => 10 }).apply(mq)
      @other = AMQP::Topology.new.queue(@q, arguments: { "x-max-length" => 11 })
    end

    def op(_i) = mq.apply(@other) && "declared"
    def cleanup = AMQP::Topology.new.queue(@q).teardown(mq, force: true)
  end

  # consume on a queue that does not exist: refused at once with NotFound,
  # and the channels it opened are given back.
  class ConsumerMissing < Path
    TITLE = "consume a missing queue"
    EXPECT = ["NotFound"].freeze

    def prepare = @missing = queue("missing")

    def op(_i)
      sub = mq.consume(@missing) { AMQP::Ack.accept }
      sub.cancel
      "subscribed"
    end

    # What a consume refused for a missing queue leaves on the broker: it
    # should leave nothing, but the engine declares the queue's ladder (its
    # DLQ and rungs) beside the subscription, not after it.
    def left_behind
      ["#{@missing}.dlq", *%w[1s 2s 4s 8s].map { |d| "#{@missing}.retry.#{d}" }].select { |q| mq.queue_counts(q) }
    end

    def stop
      left = left_behind
      return if left.empty?

      @failures << "consume of the missing queue #{@missing} (refused with NotFound) left #{left.size} queues " \
                   "declared: #{left.join(', ')}"
    end

    def cleanup = AMQP::Topology.new.queue(@missing).teardown(mq, force: true)
  end

  # A subscription whose queue is deleted under it: the broker cancels the
  # consumer, the subscription tries again with back-off, fails (404) and
  # says so in #failure; then it is cancelled. BATCH subscriptions at once,
  # each an operation: one alone spends most of its time in the back-off.
  class ConsumerDeleted < Path
    TITLE = "consumer whose queue is deleted"
    EXPECT = %w[NOT_FOUND].freeze
    BATCH = 10

    def batch = BATCH
    # How long the subscription may take to say its queue is gone: its first
    # attempt to subscribe again comes 100 ms after the loss.
    NOTICE = 5

    def expect = ctx.memory? ? %w[NOT_FOUND unnoticed] : EXPECT

    def prepare
      @cancels = []
      @unnoticed = 0
    end

    # One batch, without the outage (#stop's) that the path itself ends
    # with.
    def warm_up(_count = 1)
      attempt(-1)
    ensure
      reset
    end

    def reset
      super
      @cancels = []
      @unnoticed = 0
    end

    # BATCH consumers, counted one by one; returns nil (counted here).
    def attempt(_i)
      @ops += BATCH
      names = Array.new(BATCH) { queue("q") }
      topology = names.reduce(AMQP::Topology.new) { |t, q| t.queue(q) }
      mq.apply(topology)
      errors = Queue.new
      subs = names.map { |q| mq.consume(q, on_error: ->(e) { errors << e }) { AMQP::Ack.accept } }
      topology.teardown(mq, force: true)
      limit = ctx.memory? ? 0.2 : NOTICE
      Soak.poll(limit, interval: 0.01) { subs.all? { |s| s.failure.to_s.include?("NOT_FOUND") } }
      subs.each do |s|
        label = case s.failure
                when nil then "unnoticed"
                when /NOT_FOUND/ then "NOT_FOUND"
                else "failure: #{s.failure[0, 60]}"
                end
        @counts[label] += 1
        @wrong[label] ||= s.failure.to_s unless expect.include?(label)
      end
      # Cancelled together, each timed: what a runner shutting down does.
      @cancels.concat(subs.map { |s| Thread.new { t = Soak.now; s.cancel; Soak.now - t } }.map(&:value))
      @counts["on_error: #{errors.pop.class.name.split('::').last}"] += 1 until errors.empty?
      nil
    end

    def stop
      return if @cancels.empty?

      cancel_after_outage unless ctx.memory?
      slowest = @cancels.max
      @notes << format("cancel of a subscription whose queue is gone: median %.2fs, slowest %.2fs", @cancels.sort[@cancels.size / 2], slowest)
      if ctx.memory? && @counts["unnoticed"].positive?
        @notes << "memory://: #{@counts['unnoticed']} subscriptions never noticed their queue deleted (failure nil); " \
                  "RabbitMQ's report NOT_FOUND"
      end
      return unless slowest > CANCEL_LIMIT

      @failures << format("a cancel took %.1fs (limit %ds): it waits out the subscription's back-off before it " \
                          "stops (100 ms doubling to 5 s while its queue is gone)", slowest, CANCEL_LIMIT)
    end

    # No cancel may take longer than this, however long its subscription
    # has been without its queue.
    CANCEL_LIMIT = 1
    # How long one more subscription stays without its queue before it is
    # cancelled: its back-off (100 ms doubling to 5 s) is then in its longer
    # pauses, which a cancel must not wait out.
    DOWN = 7

    # One subscription left DOWN seconds without its queue, then cancelled.
    def cancel_after_outage
      q = queue("down")
      topology = AMQP::Topology.new.queue(q)
      mq.apply(topology)
      sub = mq.consume(q) { AMQP::Ack.accept }
      topology.teardown(mq, force: true)
      Soak.poll(DOWN * 3, interval: 0.1) { sub.down_for.to_f >= DOWN }
      down = sub.down_for.to_f
      t = Soak.now
      sub.cancel
      took = Soak.now - t
      @cancels << took
      @notes << format("a subscription %.1fs without its queue took %.2fs to cancel", down, took)
    end
  end

  # A request nobody answers: TimeoutError after its timeout, and no reply
  # counted late.
  class RequestTimeout < Path
    TITLE = "request with no responder"
    EXPECT = ["TimeoutError"].freeze
    TIMEOUT = 0.01

    def prepare
      @q = queue("rpc")
      # Requests nobody takes expire from the queue rather than pile up.
      AMQP::Topology.new.queue(@q, arguments: { "x-message-ttl" => 1000 }).apply(mq)
      @late = mq.late_replies
    end

    def op(i) = mq.request({ "n" => i }, to: @q, timeout: TIMEOUT) && "replied"

    def stop
      late = mq.late_replies - @late
      @failures << "#{late} late replies counted, with no responder" if late.positive?
    end

    def cleanup = AMQP::Topology.new.queue(@q).teardown(mq, force: true)
  end

  # replay_dead_letters, browse_dead_letters and purge_dead_letters of a
  # queue whose DLQ does not exist, in turn: NotFound naming the DLQ (its
  # passive declare fails, on a channel of its own), on both transports.
  class DeadLettersMissing < Path
    TITLE = "replay/browse/purge a missing DLQ"
    EXPECT = ["NotFound"].freeze

    def prepare = @missing = queue("missing")

    def op(i)
      case i % 3
      when 0 then "replayed #{mq.replay_dead_letters(@missing).replayed}"
      when 1 then "browsed #{mq.browse_dead_letters(@missing).dead_letters.size}"
      else "purged #{mq.purge_dead_letters(@missing).discarded}"
      end
    end
  end

  # A Connection opened, used once and closed, N times: its socket, its I/O
  # thread and its tasks must go with it.
  class Reconnect < Path
    TITLE = "Connection opened and closed"
    EXPECT = ["opened"].freeze
    # lapin's heartbeat task sees its connection closed only when it next
    # wakes, half a heartbeat later: 30 s after the close with RabbitMQ's
    # 60 s. A heartbeat of 4 s lets the settle see each one end within 2 s.
    HEARTBEAT = 4

    def prepare
      @origin = "#{ctx.origin}-reopened"
      @q = queue("probe")
      AMQP::Topology.new.queue(@q).apply(mq)
    end

    def op(_i)
      c = AMQP::Connection.open(ctx.url, origin: @origin, connect_timeout: 5, confirm_timeout: 10, heartbeat: HEARTBEAT)
      begin
        c.queue_counts(@q) ? "opened" : "no queue"
      ensure
        c.close
      end
    end

    def stop
      return unless ctx.broker

      left = Soak.poll(BROKER_SETTLE, interval: 0.25) { (n = ctx.broker.node.connections(@origin).size).zero? && n }
      @failures << "the broker still lists #{ctx.broker.node.connections(@origin).size} closed connections" unless left
    end

    def cleanup = AMQP::Topology.new.queue(@q).teardown(mq, force: true)
  end

  # A consumer whose handler fails in one way, fed N messages: each must end
  # accepted or in the DLQ, none lost. The message's own number counts it.
  class HandlerPath < Path
    EXPECT = ["published"].freeze
    CONCURRENCY = 4
    RETRIES = { max_attempts: 2, initial_delay: 0.05, max_delay: 0.05 }.freeze
    # How long every message may take to reach its end once all are
    # published (the ladder's 50 ms rung, a handler deadline).
    FINISH = 60

    def prepare
      @q = queue("q")
      AMQP::Topology.new.queue(@q).apply(mq)
    end

    def start
      @accepted = Hash.new(0)
      @lock = Mutex.new
      @published = 0
      @errors = Queue.new
      @dlq_before = dlq_depth
      @sub = mq.consume(@q, concurrency: CONCURRENCY, retries: RETRIES, timeout: handler_timeout,
                            on_error: ->(e) { @errors << e }) do |m|
        handle(m)
      end
    end

    def handler_timeout = nil

    # Each message numbered by the path itself (the mixed traffic passes
    # the same i to a turn's operations).
    def op(_i)
      mq.publish({ "n" => @published + 1 }, to: @q)
      @published += 1
      "published"
    end

    def accept(m)
      @lock.synchronize { @accepted[m.payload["n"]] += 1 }
      AMQP::Ack.accept
    end

    def dlq_depth = mq.queue_counts("#{@q}.dlq")&.dig(:ready) || 0

    # What the handler's messages end as: accepted (the engine's count:
    # an overrunning handler whose deadline the engine noticed late has its
    # first answer taken), or in the DLQ; the wait ends when they add up to
    # what was published. The handler's own count of each number says
    # whether one was accepted twice.
    def stop
      return unless @sub

      ends = -> { [@sub.stats[:accepted], dlq_depth - @dlq_before] }
      done = Soak.poll(ctx.long ? FINISH * 5 : FINISH, interval: 0.05) do
        mq.advance_clock(1) if ctx.memory? # the ladder's rung, now
        accepted, dead = ends.call
        accepted + dead >= @published
      end
      settle_overdue
      @sub.cancel
      accepted, dead = ends.call
      stats = @sub.stats
      @counts["accepted"] = accepted
      @counts["dead-lettered"] = dead
      counted, doubled = @lock.synchronize { [@accepted.size, @accepted.count { |_, c| c > 1 }] }
      @counts["accepted twice"] = doubled if doubled.positive?
      if counted < accepted
        @notes << "#{accepted - counted} accepted at their first attempt: the handler deadline was noticed after the " \
                  "handler had returned"
      end
      %i[retried timed_out abandoned].each { |k| @counts[k.to_s] = stats[k] if stats[k].to_i.positive? }
      @counts["on_error: #{@errors.pop.class.name.split('::').last}"] += 1 until @errors.empty?
      unless done
        @failures << "#{@published - accepted - dead} of #{@published} messages neither accepted nor dead-lettered " \
                     "within the wait (queue #{mq.queue_counts(@q)&.dig(:ready).inspect}, DLQ #{dead}, accepted " \
                     "#{accepted}; the rest on the ladder or lost)"
      end
      check_ends(accepted, dead)
      @sub = nil
    end

    # The handler's own rule for where each message ends.
    def check_ends(accepted, dead)
      want = self.class::ENDS
      got = { accepted: accepted, dead: dead }
      return if want.all? { |k, v| got[k] == (v == :all ? @published : 0) }

      @failures << "expected #{want.map { |k, v| "#{v == :all ? @published : 0} #{k}" }.join(', ')}; " \
                   "got #{accepted} accepted, #{dead} dead-lettered of #{@published}"
    end

    def settle_overdue; end

    def cleanup = AMQP::Topology.new.queue(@q).teardown(mq, retries: RETRIES, force: true)
  end

  # Raises on every attempt: a retry, then the DLQ past max_attempts (2).
  class HandlerRaises < HandlerPath
    TITLE = "handler raises (2 attempts, then the DLQ)"
    ENDS = { accepted: 0, dead: :all }.freeze

    def handle(m) = raise(HandlerError, "soak: handler raised on #{m.payload['n']}")
  end

  # Rejects: the DLQ at once.
  class HandlerRejects < HandlerPath
    TITLE = "handler rejects"
    ENDS = { accepted: 0, dead: :all }.freeze

    def handle(_m) = AMQP::Ack.reject("soak: rejected")
  end

  # Asks for a retry on its first attempt and accepts the second: every
  # message climbs the ladder's rung once.
  class HandlerRetries < HandlerPath
    TITLE = "handler retries once (the ladder)"
    ENDS = { accepted: :all, dead: 0 }.freeze

    def handle(m) = m.envelope.attempt == 1 ? AMQP::Ack.retry("soak: later") : accept(m)
  end

  # Overruns its deadline on the first attempt (the engine settles it as a
  # retry and discards the late accept), accepts the second in time.
  class HandlerOverruns < HandlerPath
    TITLE = "handler overruns its deadline"
    ENDS = { accepted: :all, dead: 0 }.freeze
    TIMEOUT = 0.1
    OVERRUN = 0.15

    def handler_timeout = TIMEOUT

    def handle(m)
      if m.envelope.attempt == 1
        sleep OVERRUN
        return AMQP::Ack.accept # discarded: the engine already retried it
      end
      accept(m)
    end

    # The overdue threads end once their handlers return.
    def settle_overdue = Soak.poll(5) { @sub.overdue.zero? }
  end

  PATHS = [MissingQueue, MissingExchange, BindMissingExchange, Unroutable, Nacked, Oversized, Denied, Precondition,
           ConsumerMissing, ConsumerDeleted, HandlerRaises, HandlerRejects, HandlerRetries, HandlerOverruns,
           RequestTimeout, DeadLettersMissing, Reconnect].freeze
end
