# frozen_string_literal: true

module AceMQ
  module AMQP
    module Patterns
      # The idempotency guard's events, for metrics and logs, without
      # ActiveSupport:
      #
      #   AceMQ::AMQP::Patterns.on(:duplicate) { |event, detail| Stats.increment("payments.duplicates") }
      #
      # Events: :duplicate (first_time? answered false for a confirmed key —
      # the counter worth graphing), :in_progress (answered false for a key
      # only claimed: retried, not dropped), :missing_key, :store_error (first_time? raised; the message
      # is retried), :confirm_failed and :forget_failed (detail[:error] says
      # why). detail has :key, :message and, for failures, :error.
      #
      # Subscribers run on the consumer's thread, inline: keep them short. One
      # that raises is reported with warn and does not affect the message.
      EVENTS = %i[duplicate in_progress missing_key store_error confirm_failed forget_failed].freeze

      @subscribers = Hash.new { |h, k| h[k] = [] }
      @subscribers_lock = Mutex.new

      class << self
        # Subscribe to event (one of EVENTS); returns the block, for #off.
        def on(event, &block)
          raise ConfigurationError, "Patterns.on needs a block" unless block
          unless EVENTS.include?(event)
            raise ConfigurationError, "unknown event #{event.inspect}: use one of #{EVENTS.map(&:inspect).join(', ')}"
          end

          @subscribers_lock.synchronize { @subscribers[event] = [*@subscribers[event], block] }
          block
        end

        # on(:duplicate), for the one counter the guide says to graph.
        def on_duplicate(&block) = on(:duplicate, &block)

        # Remove a subscriber returned by #on (from every event).
        def off(block)
          @subscribers_lock.synchronize do
            @subscribers.each_key { |e| @subscribers[e] = @subscribers[e] - [block] }
          end
          nil
        end

        # Call event's subscribers with detail. Returns whether any listened.
        def instrument(event, **detail)
          subscribers = @subscribers_lock.synchronize { @subscribers[event] }
          subscribers.each do |s|
            s.call(event, detail)
          rescue StandardError => e
            warn("acemq: a Patterns.on(#{event.inspect}) subscriber raised #{e.class}: #{e.message}")
          end
          !subscribers.empty?
        end
      end
    end
  end
end
