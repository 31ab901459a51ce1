# frozen_string_literal: true

module AceMQ
  module AMQP
    # A handler's verdict. Return one from every handler:
    #
    # - Ack.accept: handled; the message is gone.
    # - Ack.retry(reason): not this time; it comes back after the next rung's
    #   delay, and is dead-lettered once max_attempts is used up.
    # - Ack.reject(reason): never; it goes to {queue}.dlq at once.
    #
    # A handler that raises is a retry; one that raises FatalError is a
    # reject. What each does on the broker is decided in the engine, the same
    # for Ruby and Rust consumers.
    class Ack
      attr_reader :kind, :reason, :error_class, :up_to

      # What the idempotency guard decided about a message it settles
      # without running the handler (:duplicate, :in_progress), nil for any
      # other Ack: the consumer reports the settlement by it ("duplicate"
      # rather than "accepted" in process.acemq). It travels with the Ack to
      # the settlement; it changes nothing the broker sees, and == ignores it.
      attr_reader :verdict

      def initialize(kind, reason = nil, error_class = nil, up_to = nil, verdict = nil)
        @kind = kind
        @reason = reason&.to_s&.dup&.freeze
        @error_class = error_class&.to_s&.dup&.freeze
        @up_to = up_to
        @verdict = verdict
        freeze
      end
      private_class_method :new

      ACCEPT = new(:accept)

      def self.accept = ACCEPT

      # `error:` names the error class that caused it (a class or a string);
      # it is kept on the copy as x-acemq-error-class.
      def self.retry(reason = "retry requested", error: nil)
        new(:retry, reason, error.is_a?(Module) ? error.name : error)
      end

      def self.reject(reason = "rejected", error: nil)
        new(:reject, reason, error.is_a?(Module) ? error.name : error)
      end

      # Not now, and not the message's fault: another handler holds its
      # idempotency claim. It goes round the ladder without spending an
      # attempt, for at most up_to seconds (the store's claim timeout, after
      # which the claim is taken over and it runs); then it is a retry. The
      # idempotent guard returns it; a handler has no reason to.
      def self.wait(reason, up_to:)
        new(:wait, reason, nil, Float(up_to))
      end

      def accept? = kind == :accept
      def wait? = kind == :wait
      def retry? = kind == :retry
      def reject? = kind == :reject

      def ==(other)
        other.is_a?(Ack) && other.kind == kind && other.reason == reason && other.error_class == error_class &&
          other.up_to == up_to
      end
      alias eql? ==

      def hash = [kind, reason, error_class, up_to].hash

      def inspect
        reason ? "#<AceMQ::AMQP::Ack #{kind} #{reason.inspect}>" : "#<AceMQ::AMQP::Ack #{kind}>"
      end
      alias to_s inspect
    end
  end
end
