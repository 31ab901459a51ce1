# frozen_string_literal: true

require "acemq/amqp"

module AceMQ
  module Testing
    # What happened to one message that `deliver` ran through a consumer
    # class's pipeline, read off the broker after it settled:
    #
    # - accepted?      the pipeline accepted it (true for a duplicate too: a
    #                  duplicate is settled as accepted, see duplicate?);
    # - duplicate?     the idempotency guard accepted it without running the
    #                  handler, because its key was already handled;
    # - retried?       it went to a rung of the retry ladder; rung says which
    #                  (1 after the first attempt), advance_clock or
    #                  next_attempt brings it back;
    # - dead_lettered? it is in {queue}.dlq: rejected, or out of attempts;
    #                  reason, error_class and attempt are the dead letter's own,
    #                  and dead_letter is it (an AMQP::DeadLetters::Letter);
    # - waiting?       after advance_clock: the clock did not reach the end of
    #                  the rung it waits in, so nothing happened yet.
    #
    # Predicates, so `expect(outcome).to be_retried` reads in RSpec and
    # `assert_retried outcome` in Minitest, and both fail with the outcome's
    # inspect.
    class Outcome
      # advance_clock by this much brings back whatever waits in any rung:
      # ten years is longer than any retry delay anybody means.
      PAST_EVERY_RUNG = 10 * 365 * 24 * 3600.0

      # How many attempts last_attempt follows before deciding the ladder
      # never ends (a handler answering retry with a ladder of that length).
      MAX_WALK = 1_000

      attr_reader :kind, :consumer, :message, :attempt, :ack, :error, :dead_letter, :previous

      # For ConsumerRun: the broker's counters and the handler results seen
      # when this outcome was read, which the next one is measured from.
      attr_reader :mark

      def initialize(run:, kind:, message:, attempt:, mark:, ack: nil, error: nil, dead_letter: nil, previous: nil)
        @run = run
        @consumer = run.consumer
        @kind = kind
        @message = message
        @attempt = attempt
        @mark = mark
        @ack = ack
        @error = error
        @dead_letter = dead_letter
        @previous = previous
        freeze
      end

      def accepted? = kind == :accepted || kind == :duplicate
      def duplicate? = kind == :duplicate
      # On a rung: retried, or waited (another handler holds the message's
      # idempotency claim: no attempt spent).
      def retried? = kind == :retried || kind == :waited
      def waited? = kind == :waited
      def dead_lettered? = kind == :dead_lettered
      def waiting? = kind == :waiting

      # The rung the message waits in: the n-th after attempt n failed.
      def rung = retried? || waiting? ? attempt : nil

      # Why: the dead letter's x-acemq-reason, or what the handler answered
      # (retry_later's reason, or the error it raised as "Class: message").
      def reason
        return dead_letter.reason if dead_letter
        return ack.reason if ack&.reason

        "#{error.class}: #{error.message}" if error
      end

      def error_class
        return dead_letter.error_class if dead_letter

        ack&.error_class || error&.class&.name
      end

      # Move the test's broker clock forward by seconds and return what
      # the next attempt did, or a waiting? outcome when the rung's delay has
      # not run out yet. Only for a retried (or waiting) message.
      def advance_clock(seconds, timeout: ConsumerRun::TIMEOUT)
        @run.advance(self, seconds, timeout: timeout)
      end

      # The next attempt, however long its rung is.
      def next_attempt(timeout: ConsumerRun::TIMEOUT)
        advance_clock(PAST_EVERY_RUNG, timeout: timeout).tap do |outcome|
          if outcome.waiting?
            raise @run.failure,
                  "#{consumer}: #{describe_id} is in no rung of #{@run.queue}'s ladder that the clock brings back"
          end
        end
      end

      # Follow the message up its ladder to the end: the outcome of its last
      # attempt (accepted, a duplicate, or dead-lettered). history has the way there.
      def last_attempt(timeout: ConsumerRun::TIMEOUT)
        outcome = self
        MAX_WALK.times do
          return outcome unless outcome.retried? || outcome.waiting?

          outcome = outcome.next_attempt(timeout: timeout)
        end
        raise @run.failure,
              "#{consumer}: #{describe_id} was still being retried after #{MAX_WALK} attempts"
      end

      # Every settled outcome of this message so far, first attempt first.
      def history
        list = []
        outcome = self
        while outcome
          list.unshift(outcome) unless outcome.waiting?
          outcome = outcome.previous
        end
        list
      end

      def inspect
        "#<AceMQ::Testing::Outcome #{consumer} #{describe_id}: #{describe_kind}>"
      end
      alias to_s inspect

      private

      def describe_id = "message #{message.envelope&.id.inspect}"

      def describe_kind
        case kind
        when :accepted then "accepted on attempt #{attempt}"
        when :duplicate then "duplicate on attempt #{attempt} (accepted without running the handler)"
        when :retried then "retried after attempt #{attempt}, waiting in rung #{rung}#{because}"
        when :waited then "waiting in rung #{rung} for another handler's idempotency claim (attempt #{attempt} not spent)"
        when :waiting then "still waiting in rung #{rung} (the clock has not reached the end of its delay)"
        when :dead_lettered then "dead-lettered after attempt #{attempt}#{because}"
        end
      end

      def because = reason ? ": #{reason.inspect}" : ""
    end
  end
end
