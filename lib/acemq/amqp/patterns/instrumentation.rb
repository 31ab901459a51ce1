# frozen_string_literal: true

module AceMQ
  module AMQP
    module Patterns
      # The idempotency guard's events, the older way to hear them: an alias
      # for AceMQ.subscribe("idempotency.acemq") filtered by verdict, kept so
      # code written against it goes on working.
      #
      #   AceMQ::AMQP::Patterns.on(:duplicate) { |event, detail| Stats.increment("payments.duplicates") }
      #
      # is the same as
      #
      #   AceMQ.subscribe("idempotency.acemq") do |e|
      #     Stats.increment("payments.duplicates") if e[:verdict] == "duplicate"
      #   end
      #
      # Events: :duplicate (first_time? answered false for a confirmed key —
      # the counter worth graphing), :in_progress (answered false for a key
      # only claimed: retried, not dropped), :missing_key, :store_error (first_time? raised; the message
      # is retried), :confirm_failed and :forget_failed (detail[:error] says
      # why), :held (a keep_order guard holds the message in place while
      # another worker's claim on its key is live) and :taken_over (the
      # store took over the claim of a worker whose process has exited;
      # detail[:error] names it). detail has :key, :message and, for
      # failures, :error.
      #
      # Subscribers run on the consumer's thread, inline: keep them short. One
      # that raises is reported with warn and does not affect the message.
      EVENTS = %i[duplicate in_progress missing_key store_error confirm_failed forget_failed held taken_over].freeze

      @listeners = {}
      @listeners_lock = Mutex.new

      class << self
        # Subscribe to event (one of EVENTS); returns the block, for #off.
        def on(event, &block)
          raise ConfigurationError, "Patterns.on needs a block" unless block
          unless EVENTS.include?(event)
            raise ConfigurationError, "unknown event #{event.inspect}: use one of #{EVENTS.map(&:inspect).join(', ')}"
          end

          verdict = event.to_s
          subscriber = AceMQ::Events.subscribe("idempotency.acemq") do |e|
            next unless e[:verdict] == verdict

            detail = { key: e[:key], message: e[:message] }
            detail[:error] = e[:error] if e[:error]
            block.call(event, detail)
          end
          @listeners_lock.synchronize { (@listeners[block] ||= []) << subscriber }
          block
        end

        # on(:duplicate), for the one counter the guide says to graph.
        def on_duplicate(&block) = on(:duplicate, &block)

        # Remove a subscriber returned by #on (from every event).
        def off(block)
          subscribers = @listeners_lock.synchronize { @listeners.delete(block) } || []
          subscribers.each { |s| AceMQ::Events.unsubscribe(s) }
          nil
        end

        # Deprecated: the engine's guard emits the idempotency events (once,
        # for Rust subscribers, the metrics and Ruby alike), and the library
        # no longer calls this. Kept so code that announced its own verdicts
        # goes on working: it delivers one to Ruby's subscribers only.
        # Returns whether anything listened.
        def instrument(event, key: nil, message: nil, error: nil)
          _deliver({ verdict: event.to_s, key: key, error: error }, message)
        end

        # One of the engine guard's idempotency events (verdict, key, error),
        # handed over by the extension on the handler's thread while the
        # guard decides: delivered inline, with the message it is about.
        # Returns whether anything listened.
        def _deliver(payload, message)
          AceMQ::Events.instrument(
            "idempotency.acemq",
            payload.merge(message_id: message&.envelope&.id, queue: message&.delivery&.queue, message: message)
          )
        end
      end
    end
  end
end
