# frozen_string_literal: true

module AceMQ
  module AMQP
    # Where a delivery came from, and every AMQP property it carried
    # (Properties; nil on a message built by hand).
    Delivery = Struct.new(:queue, :exchange, :routing_key, :redelivered, :properties, keyword_init: true) do
      def redelivered? = !!redelivered
    end

    # One message as a handler sees it: the parsed JSON payload, the
    # envelope, and the delivery it arrived by (nil for a message built by
    # hand in a spec). A consumed message is a Message::Consumed, which
    # reads the same fields from the engine's delivery.
    class Message
      def initialize(payload:, envelope: Envelope.new, delivery: nil)
        @payload = payload
        @envelope = envelope
        @delivery = delivery
        freeze
      end

      # Built from what NativeConsumer#_next hands over: a NativeDelivery.
      def self.from_native(native) = Consumed.new(native)

      attr_reader :payload, :envelope, :delivery

      def id = envelope&.id
      def type = envelope.type
      def attempt = envelope.attempt
      def headers = envelope.headers

      # The engine's delivery, for the subscription to settle: none for a
      # message built by hand.
      def native_delivery = nil

      def inspect
        "#<AceMQ::AMQP::Message id=#{id.inspect} type=#{type.inspect} payload=#{payload.inspect}>"
      end

      # A consumed message. It reads the engine's delivery object
      # (NativeDelivery) field by field, each the first time it is asked
      # for: the payload becomes Ruby objects on the first #payload, the
      # envelope is built on the first #envelope, and #id, #type, #attempt
      # and #headers never build it. A handler pays for what it reads.
      class Consumed < Message
        # rubocop:disable Lint/MissingSuper -- a consumed message has no hand-given fields
        def initialize(native)
          # The message itself is frozen, as one built by hand is; what has
          # been read so far is kept by the delivery (NativeDelivery#_payload
          # and #_read), so that a message is one object, not two.
          @native = native
          freeze
        end
        # rubocop:enable Lint/MissingSuper

        def payload = @native._payload

        def envelope
          lazily(:envelope) do
            Envelope.new(id: @native.id, type: @native.type, origin: @native.origin, timestamp: @native.timestamp,
                         attempt: @native.attempt, headers: headers)
          end
        end

        def delivery
          lazily(:delivery) do
            Delivery.new(queue: @native.queue, exchange: @native.exchange, routing_key: @native.routing_key,
                         redelivered: @native.redelivered?, properties: Properties.new(**@native.properties).freeze)
          end
        end

        def id = lazily(:id) { @native.id }
        def type = lazily(:type) { @native.type }
        def attempt = @native.attempt
        def headers = lazily(:headers) { @native.headers.freeze }
        def native_delivery = @native

        private

        def lazily(name)
          read = @native._read
          read.fetch(name) { read[name] = yield }
        end
      end
    end
  end
end
