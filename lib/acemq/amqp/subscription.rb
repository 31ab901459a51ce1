# frozen_string_literal: true

require "English"

require "acemq/amqp/sql"

module AceMQ
  module AMQP
    # A running consumer: `concurrency` Ruby threads, each taking the next
    # delivery (waiting without the GVL), calling the handler, and handing
    # what it returned to the engine to settle. Returned by Connection#consume.
    class Subscription
      # How long one wait for a delivery lasts before the thread looks
      # whether it has been cancelled.
      POLL = 0.5

      attr_reader :queue

      def initialize(native, handler, concurrency:, on_error:, batch: 1, breaker: nil)
        @native = native
        # Asked, on the handler's thread, whether a raise counts toward the
        # circuit breaker (nil: no on: or ignore:, the engine counts it).
        @breaker = breaker&.on || breaker&.ignore ? breaker : nil
        @handler = handler
        # A handler answering call_many (Patterns.idempotent does) is given
        # up to `batch` deliveries at once: what is already buffered, never
        # waiting to fill it. Each still gets its own Ack.
        @batch = handler.respond_to?(:call_many) ? batch : 1
        @on_error = on_error
        @queue = native.queue
        @resubscribed = 0
        @cancelled = false
        @timeout = native._timeout
        @overdue = []
        @started = 0
        @threads = Array.new(concurrency) { start_worker }
        native._warnings.each { |w| @on_error&.call(ConfigurationWarning.new(w)) }
        @watch = Thread.new { watch_deadlines }
        @watch.name = "acemq #{@queue} deadlines"
      end

      # Stop taking deliveries, let the handlers in progress finish and
      # settle, then close. Unsettled deliveries go back to the queue.
      #
      # Called from one of its own handlers, it returns at once: that
      # handler's delivery is settled with what it returns, and its thread
      # closes the subscription once the others have finished.
      def cancel
        return self if @cancelled

        @cancelled = true
        stop_taking
        if @threads.include?(Thread.current)
          @close_after_handler = true
          return self
        end
        finish
        self
      end
      alias close cancel

      # Stop taking deliveries and return at once: buffered ones go back to
      # the queue, handlers in progress go on and settle. Then #drain waits
      # for them and #cancel closes. This is what a runner's quiet and the
      # first step of its shutdown are.
      def stop_taking
        return self if @stopped

        @stopped = true
        @native._stop
        self
      end

      # Wait until deadline (a Time) for every handler thread to finish;
      # returns how many had not. Call stop_taking first.
      def drain(deadline)
        @threads.count do |t|
          next false if t == Thread.current

          left = deadline - Time.now
          left.positive? ? join_quietly(t, left).nil? : t.alive?
        end
      end

      # Why the subscription stopped without being asked to (the broker
      # cancelled it, or its delivery stream closed), nil while it runs or
      # after stop_taking/cancel.
      def ended
        return nil if @stopped || @cancelled || @threads.any?(&:alive?)
        return nil unless @threads.all? { |t| t.status == false } # all returned, none raised

        failure || "the delivery stream closed"
      end

      # Handler threads that died and were not replaced. A thread whose
      # handler did not return (an exception that is not a StandardError,
      # a Thread#kill) is replaced at once (#aborted); one that died between
      # deliveries is counted here, and the runner restarts a consumer that
      # lost one.
      def dead_workers = @threads.count { |t| t.status.nil? }

      # Handler threads whose handler ran past the timeout and is still
      # running: its delivery was settled as a retry by the engine, and what
      # it returns will be discarded. Each was replaced by a fresh thread.
      def overdue = @overdue.count(&:alive?)

      # The handler deadline, in seconds.
      attr_reader :timeout

      # Seconds without a channel (the broker unreachable, the queue gone),
      # nil while subscribed.
      def down_for = @native._down_for

      # How many times it lost its channel and subscribed again by itself.
      def resubscriptions = @native._resubscriptions

      def cancelled? = @cancelled

      # Counters so far: accepted, retried, dead_lettered, waited (round the
      # ladder for another handler's claim, no attempt spent), timed_out
      # (settled as retries by the handler deadline), abandoned (results
      # that came after the deadline, discarded), expired (requests dropped
      # past their deadline) and error_replied (failed requests answered
      # with an error reply; docs/request-reply.md).
      def stats = @native._stats

      # Why the broker ended the subscription, if it did.
      def failure = @native._failure

      def alive? = @threads.any?(&:alive?)

      # Take no deliveries until #resume: the broker's consumer is cancelled
      # and what it had buffered goes back to the queue with no attempt
      # spent; handlers in progress finish and settle. Paused is not down:
      # the channel stays, and a lost one comes back paused.
      def pause
        @native._pause
        self
      end

      # Take deliveries again (once its circuit breaker, if open, closes).
      def resume
        @native._resume
        self
      end

      def paused? = @native._paused?

      # The circuit breaker's state: "closed", "open", "half_open" (the next
      # message is a trial) or "trying"; nil without one.
      def breaker = @native._breaker

      # The engine's consumer: what a runner's supervisor pauses by name.
      attr_reader :native

      # The handler threads' count.
      def concurrency = @threads.size

      def inspect = "#<AceMQ::AMQP::Subscription queue=#{@queue.inspect} cancelled=#{@cancelled}>"

      private

      # What the deadline watch reads of a handler thread: the delivery (or
      # batch) its handler is running (nil between deliveries), and whether
      # the watch has replaced it. A Struct the thread holds, not
      # thread-locals: it is written twice per delivery.
      Worker = Struct.new(:handling, :overdue) do
        # Whether the engine's deadline has settled what it is handling:
        # the engine times each delivery, this only asks.
        def overdue_handler?
          h = handling
          h.is_a?(Array) ? h.any?(&:_overdue?) : h&._overdue?
        end
      end
      private_constant :Worker

      def start_worker
        n = (@started += 1)
        Thread.new do
          Thread.current.name = "acemq #{@queue} #{n}"
          work(Thread.current[:acemq_worker] = Worker.new)
        end
      end

      # The engine settles a delivery whose handler runs past the timeout (a
      # retry) and discards what the handler returns later; the handler is
      # not interrupted — Thread#raise could land in the middle of a write.
      # What is left to do here is keep the consumer's capacity: the overdue
      # thread leaves the pool once its handler returns, and a fresh one
      # takes its place now. At most `concurrency` overdue threads at once:
      # past that, handlers are hanging, and more threads would not help.
      def watch_deadlines
        # Asked no more often than the engine's own watch looks (at least
        # every 50 ms): nothing turns overdue in between.
        tick = [@native._deadline_tick, 0.05].max
        until @stopped || @cancelled
          sleep tick
          @threads.dup.each do |t|
            worker = t[:acemq_worker]
            next unless worker&.overdue_handler? && t.alive?
            if @overdue.count(&:alive?) >= @threads.size
              warn_capacity
              next
            end

            worker.overdue = true
            @overdue << t
            @threads[@threads.index(t)] = start_worker unless @stopped || @cancelled
          end
          @overdue.select!(&:alive?)
        end
      rescue StandardError => e
        @on_error&.call(e)
      end

      def warn_capacity
        return if @capacity_warned

        @capacity_warned = true
        @on_error&.call(TimeoutError.new("#{@queue}: #{@overdue.size} handlers are still running past their timeout " \
                                         "of #{@timeout}s; no more threads are started for it until they return"))
      end

      # The loop a handler thread runs. Once per delivery, so written for
      # it: a `while` rather than `loop` and a block, the batch size looked
      # at once, and a delivery settled in #handle itself.
      def work(me)
        native = @native
        many = @batch > 1
        loop_deliveries(me, native, many)
      ensure
        aborted(me) if me.handling
      end

      def loop_deliveries(me, native, many)
        while true # rubocop:disable Style/InfiniteLoop
          deliveries = begin
            many ? native._next_many(@batch, POLL) : native._next(POLL)
          rescue StopIteration # the consumer is closed
            break
          end
          if deliveries.nil?
            report(native._errors)
            note_resubscriptions
            next
          end

          me.handling = deliveries
          many ? handle_many(deliveries) : handle(deliveries)
          me.handling = nil
          break if @close_after_handler || me.overdue
        end
        finish if @close_after_handler
      end

      # A handler that did not return: an exception that is not a
      # StandardError passed through it (only a StandardError is a handler's
      # failure, and the rest is not swallowed here), or its thread was
      # killed. Held until the consumer closed, its delivery would keep a
      # prefetch slot and the thread's capacity for good, silently (issue
      # 47: two `raise Exception` left a subscription of two threads with
      # none, 32 messages unacked). So: the delivery goes round the retry
      # ladder with the reason (a poison message still ends in the DLQ),
      # on_error hears of it, and a fresh thread takes this one's place.
      def aborted(me)
        held = me.handling
        me.handling = nil
        # The process is exiting and Ruby is killing its threads: no handler
        # failed. Its delivery stays unacknowledged, and the broker gives it
        # back when the connection goes, with no attempt spent; no thread is
        # started (there can be none now) and nothing is reported.
        return if Subscription.exiting? && !$ERROR_INFO
        why = $ERROR_INFO ? Subscription.describe($ERROR_INFO) : "its thread was killed"
        error = HandlerAborted.new("#{@queue}: the handler did not return (#{why}); its thread ended, its message " \
                                   "goes round the retry ladder, and a fresh thread takes its place")
        # Its copy's x-acemq-backtrace is then where the handler was when
        # the exception went through it.
        error.set_backtrace($ERROR_INFO.backtrace) if $ERROR_INFO&.backtrace
        Array(held).each { |d| settle(d, error) }
        @on_error&.call(error)
        i = @threads.index(Thread.current)
        @threads[i] = start_worker if i && !@stopped && !@cancelled && !me.overdue
      rescue StandardError => e
        @on_error&.call(e)
      end

      # The engine subscribes again by itself after a lost channel; on_error
      # hears of it (once per loss, from whichever thread looks first, when
      # the subscription is next idle), so a broker restart is not silent.
      def note_resubscriptions
        n = @native._resubscriptions
        return if n <= @resubscribed

        @resubscribed = n
        @on_error&.call(ConnectionClosed.new("#{@queue}: the subscription lost its channel and subscribed again " \
                                             "(#{n} #{n == 1 ? 'time' : 'times'} so far): #{failure || 'connection closed'}"))
      end

      # Wait for every other handler thread, then close.
      def finish
        @threads.each { |t| join_quietly(t) unless t == Thread.current }
        @native._close
        report(@native._errors)
      end

      # The delivery is the handler's message (a Message::Consumed).
      def handle(message)
        # Inside the message's trace context when OpenTelemetry is loaded
        # (the constant looked at here first: without it, no call at all).
        result = if defined?(::OpenTelemetry) && Tracing.enabled?
                   Tracing.process(message, @queue) { |span| run(message).tap { |r| Tracing.outcome(span, r) } }
                 else
                   run(message)
                 end
        errors = @native._settle(message, result, @breaker && counts?(result))
        report(errors) if errors
      end

      # Whether the breaker counts `result`, a raise (nil for anything else).
      # A matcher that raises counts it, and on_error hears why.
      # Any exception, not only a StandardError: the matcher is the
      # application's code run inside the settlement, and one that raised
      # SystemStackError or Interrupt ended the handler thread with its
      # delivery held and no thread in its place (the hostile run of issue
      # 49 part 2: 0 of 20 handled, 22 held).
      def counts?(result)
        return nil unless result.is_a?(StandardError)

        @breaker.counts?(result)
      rescue Exception => e # rubocop:disable Lint/RescueException
        @on_error&.call(ConfigurationError.new("#{@queue}: circuit_breaker on:/ignore: raised #{Subscription.describe(e)}; " \
                                               "the failure counts"))
        true
      end

      # Whether the process is exiting: Ruby kills the threads left once the
      # main thread has ended (returned, exit, or a signal such as TERM), so
      # a handler thread killed then is the process ending, not a handler
      # that did not return (#aborted). Not an at_exit flag: Minitest and
      # some servers run for the process's whole life inside at_exit.
      def self.exiting? = !Thread.main.alive?

      # An exception's class and message for a report, whatever it does: a
      # message that raises, is nil or not a String, a class whose name is
      # overridden or nil.
      def self.describe(error)
        name = Module.instance_method(:name).bind_call(error.class) || "an anonymous #{error.class.superclass}"
        message = begin
          error.message.to_s
        rescue Exception # rubocop:disable Lint/RescueException
          "(its message raised)"
        end
        "#{name}: #{message.scrub[0, 300]}"
      end

      def run(message)
        @handler.call(message)
      rescue StandardError => e
        # Only a StandardError is a handler failure. Anything else (Interrupt,
        # SystemExit, a Thread#kill) passes through untouched; the delivery
        # stays unsettled and goes back to the queue when the consumer closes.
        outage(e)
      end

      # A handler that found the database away (SQL.unavailable?) waits
      # round the ladder without spending an attempt, for up to
      # SQL::OUTAGE_WAIT: retried, the valid messages that arrive during an
      # outage would use up their attempts and be dead-lettered. Any other
      # error is itself (a retry).
      def outage(error)
        return error unless SQL.unavailable?(error)

        Ack.wait("the database is unavailable (#{error.class}: #{error.message.to_s.strip[0, 300]}); waiting " \
                 "without spending an attempt", up_to: SQL::OUTAGE_WAIT)
      end

      # call_many returns one result per message: an Ack, or the
      # StandardError its handler raised.
      def handle_many(messages)
        results = Tracing.process_many(messages, @queue) do
          @handler.call_many(messages)
        rescue StandardError => e
          # Whatever failed for the batch as a whole failed for each of its
          # messages: each is retried, none is left unsettled.
          Array.new(messages.size, e)
        end
        messages.each_with_index { |m, i| settle(m, results[i].is_a?(StandardError) ? outage(results[i]) : results[i]) }
      end

      # The engine reads the result itself (an Ack, the StandardError the
      # handler raised, or anything else, which is not an Ack) and settles.
      # A retry or reject is settled in the background (its copy is
      # confirmed before the original is acknowledged); what went wrong with
      # earlier ones comes back here. Each of those messages was put back on
      # the queue: say so, and go on.
      def settle(delivery, result)
        report(@native._settle(delivery, result, @breaker && counts?(result)))
      end

      # Thread#join re-raises what killed the thread; a subscription being
      # closed must close whatever its handler threads died of.
      def join_quietly(thread, limit = nil)
        thread.join(limit)
      rescue Exception # rubocop:disable Lint/RescueException
        thread
      end

      def report(errors)
        errors&.each { |e| @on_error&.call(e) }
        nil
      end
    end
  end
end
