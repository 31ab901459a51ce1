# frozen_string_literal: true

require "acemq/amqp"
require "acemq/testing/outcome"

module AceMQ
  module Testing
    # One consumer class running in one test, as the runner would run it:
    # its topology declared on the test's broker, and the class's own
    # subscribe (its pipeline: the idempotency macro, its concurrency,
    # prefetch, batch and retry ladder) on one instance kept for the
    # test, as the runner keeps one for the life of the process.
    #
    # What happened to a message is read off the broker, not decided here:
    # the subscription's counters say which way it was settled, the queue's
    # depth says when, and the dead letter says why. The only thing the kit
    # adds is an around: hook (the one the runner uses for the Rails
    # executor) that notes what the pipeline returned or raised.
    class ConsumerRun
      # Seconds to wait for a message to settle before failing the test.
      TIMEOUT = 5
      # Seconds between looks at the broker while waiting.
      POLL = 0.002

      # The broker's counters and the handler results noted so far.
      Mark = Struct.new(:stats, :results, :duplicates)

      attr_reader :consumer, :instance, :queue, :subscription

      def initialize(harness, consumer, instance)
        @harness = harness
        @consumer = consumer
        @instance = instance
        @lock = Mutex.new
        @results = []
        @errors = []
        consumer.topology.apply(connection)
        @queue = consumer.queue_name
        # Without the Rails executor the runner would pass: its complete hook
        # returns the thread's ActiveRecord connection to the pool, and under
        # transactional tests that connection is the test's own (Rails
        # lends it to every thread so that they see its uncommitted rows).
        @subscription = consumer.subscribe(connection, instance: instance, around: method(:around),
                                                       on_error: ->(error) { @lock.synchronize { @errors << error } })
      end

      # Publish message to the queue (or through exchange: with
      # routing_key:, to exercise the class's bindings) and return its
      # Outcome once the broker has settled it.
      def deliver(message, exchange: nil, routing_key: nil, timeout: TIMEOUT)
        # Messages already in the queue (published to it earlier in the
        # test) are the consumer's to handle first; counted from here,
        # what moves is this message alone.
        await_idle(timeout)
        before = mark
        connection.publish(message.payload, to: routing_key || (exchange ? "" : queue), exchange: exchange || "",
                                            envelope: message.envelope)
        settle(message, before, attempt: 1, previous: nil, timeout: timeout)
      end

      # See Outcome#advance_clock.
      def advance(outcome, seconds, timeout: TIMEOUT)
        unless outcome.retried? || outcome.waiting?
          raise AMQP::ConfigurationError, "#{outcome.inspect} is not waiting in a rung: there is no next attempt"
        end

        connection.advance_clock(seconds)
        # The clock moves rung messages back to the queue before
        # advance_clock returns, so a message still absent from the queue
        # after it, and not settled meanwhile, is still in its rung. Depth
        # first: read the other way round, a handler finishing in between
        # would look like nothing happened.
        moved = !idle? || subscription.stats != outcome.mark.stats
        settled = outcome.waiting? ? outcome.previous : outcome
        unless moved
          return Outcome.new(run: self, kind: :waiting, message: outcome.message, attempt: outcome.attempt,
                             mark: outcome.mark, previous: settled)
        end

        attempt = settled.waited? ? outcome.attempt : outcome.attempt + 1
        settle(outcome.message, outcome.mark, attempt: attempt, previous: settled, timeout: timeout)
      end

      def stop(deadline)
        # A handler that never returns would hold cancel for ever: give it
        # until the deadline and then leave it, saying so.
        closing = Thread.new { @subscription.cancel }
        # What cancel raises is the test's failure, raised here by join.
        closing.report_on_exception = false
        return if closing.join([deadline - Time.now, 0].max)

        warn("acemq: #{consumer}'s handler was still running when the test ended; left running")
      end

      def errors = @lock.synchronize { @errors.dup }

      # What a test framework counts as a failed assertion (see Harness).
      def failure = @harness.failure

      private

      def connection = @harness.connection

      # The around: hook: what the pipeline returned (for a batch, the
      # results; one message is in flight, so the last), or what it raised,
      # which is re-raised untouched for the subscription to settle.
      def around
        result = yield
        note(result.is_a?(Array) ? result.last : result)
        result
      rescue StandardError => e
        note(e)
        raise
      end

      def note(result) = @lock.synchronize { @results << result }

      def mark = Mark.new(subscription.stats, @lock.synchronize { @results.size }, @harness.duplicates.size)

      # Nothing ready and nothing unacknowledged: the original is settled,
      # which the engine does only after a retry's or a dead letter's copy
      # is confirmed.
      def idle?
        depth = connection.queue_depth(queue)
        depth.nil? || (depth[:ready].zero? && depth[:unacked].zero?)
      end

      def settle(message, before, attempt:, previous:, timeout:)
        stats = await(message, before, timeout)
        moved = stats.to_h { |k, v| [k, v - before.stats[k]] }
        result = @lock.synchronize { @results[before.results..].last }
        ack = result if result.is_a?(AMQP::Ack)
        error = result if result.is_a?(StandardError)
        now = Mark.new(stats, @lock.synchronize { @results.size }, @harness.duplicates.size)
        common = { run: self, message: message, mark: now, ack: ack, error: error, previous: previous }

        if moved[:dead_lettered].positive?
          letter = dead_letter_of(message)
          Outcome.new(kind: :dead_lettered, attempt: letter ? letter.attempt : attempt, dead_letter: letter, **common)
        elsif moved[:retried].positive?
          Outcome.new(kind: :retried, attempt: attempt, **common)
        elsif moved[:waited].positive?
          Outcome.new(kind: :waited, attempt: attempt, **common)
        elsif duplicate?(message, before.duplicates)
          Outcome.new(kind: :duplicate, attempt: attempt, **common)
        else
          Outcome.new(kind: :accepted, attempt: attempt, **common)
        end
      end

      def await(message, before, timeout)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        loop do
          # Depth first, for the reason advance gives.
          idle = idle?
          stats = subscription.stats
          return stats if idle && stats.any? { |k, v| v > before.stats[k] }

          if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
            raise failure, not_settled(message, timeout)
          end

          sleep POLL
        end
      end

      def await_idle(timeout)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        until idle?
          if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
            raise failure,
                  "#{consumer} did not finish the messages already in #{queue} within #{timeout}s " \
                  "(#{connection.queue_depth(queue).inspect})"
          end

          sleep POLL
        end
      end

      def not_settled(message, timeout)
        depth = connection.queue_depth(queue)
        text = +"#{consumer} did not settle message #{message.envelope&.id.inspect} within #{timeout}s " \
                "(#{queue}: #{depth.inspect}; #{subscription.stats.inspect})"
        text << "; errors outside the handler: #{errors.map(&:message).join('; ')}" unless errors.empty?
        text << ": is its handler blocked, or did the message go to another queue?"
        text
      end

      # The last dead letter with the message's id. A message without an id
      # is dead-lettered with an empty one.
      def dead_letter_of(message)
        depth = connection.queue_depth("#{queue}.dlq")
        return nil unless depth && depth[:ready].positive?

        id = message.envelope&.id.to_s
        connection.peek_dead_letters(queue, limit: depth[:ready]).reverse.find { |l| l.id.to_s == id }
      end

      def duplicate?(message, since)
        id = message.envelope&.id
        @harness.duplicates.drop(since).any? { |q, i| q == queue && (id.nil? || i == id) }
      end
    end
  end
end
