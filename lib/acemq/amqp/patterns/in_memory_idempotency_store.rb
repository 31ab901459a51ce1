# frozen_string_literal: true

module AceMQ
  module AMQP
    module Patterns
      # Keys remembered in this process for a sliding window (the engine's
      # store). Correct for one process and wrong for two — two consumer
      # processes each with their own memory is exactly the case the pattern
      # exists for — so right for a spec or development, wrong for production.
      #
      # Same states as the SQL store: a claim that is taken over once older
      # than claim_timeout, and a confirmed key that never is. Answers
      # first_time?, confirm, forget, confirmed?, size and clear.
      #
      # window: and claim_timeout: are seconds; what is left out is nil here
      # and core's default (DEFAULT_WINDOW, DEFAULT_CLAIM_TIMEOUT).
      class InMemoryIdempotencyStore
        def self.new(window: nil, claim_timeout: nil)
          _new(window.nil? ? nil : Float(window), claim_timeout.nil? ? nil : Float(claim_timeout))
        rescue TypeError, ArgumentError => e
          raise if e.is_a?(ConfigurationError)

          raise ConfigurationError, "window: and claim_timeout: are seconds (#{e.message})"
        end

        alias length size

        def inspect = "#<AceMQ::AMQP::Patterns::InMemoryIdempotencyStore size=#{size}>"
      end
    end
  end
end
