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
    # hand in a spec). A consumed message is a Message::Consumed: the
    # engine's delivery itself, which reads the same fields from it.
    class Message
      def initialize(payload:, envelope: Envelope.new, delivery: nil)
        @payload = payload
        @envelope = envelope
        @delivery = delivery
        freeze
      end

      # What NativeConsumer#_next hands over is already the message (a
      # Message::Consumed); kept for callers of the earlier wrapper.
      def self.from_native(native) = native

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

      # A consumed message: the engine's own delivery object, made by the
      # consumer (no allocator, so no `new`) and frozen, as one built by
      # hand is. It reads the delivery field by field, each the first time
      # it is asked for, and keeps what it read (in the delivery, `_read`):
      # the payload becomes Ruby objects on the first #payload (defined by
      # the engine), the envelope is built on the first #envelope, and #id,
      # #type, #attempt and #headers never build it. A handler pays for
      # what it reads. One object a delivery, not a Message wrapping it:
      # one allocation and one initialize fewer on every delivery's path.
      class Consumed < Message
        def envelope
          lazily(:envelope) do
            Envelope.new(id: _id, type: _type, origin: _origin, timestamp: _timestamp, attempt: attempt, headers: headers)
          end
        end

        def delivery
          lazily(:delivery) do
            Delivery.new(queue: _queue, exchange: _exchange, routing_key: _routing_key,
                         redelivered: _redelivered?, properties: Properties.new(**_properties).freeze)
          end
        end

        def id = lazily(:id) { _id }
        def type = lazily(:type) { _type }
        def headers = lazily(:headers) { _headers.freeze }

        # The engine's delivery, for the subscription to settle: itself.
        def native_delivery = self

        # NativeDelivery's own readers, from before the delivery was the
        # message. Deprecated: each warns once, naming the reader to use.
        READERS = { origin: [:_origin, "envelope.origin"], timestamp: [:_timestamp, "envelope.timestamp"],
                    properties: [:_properties, "delivery.properties"], queue: [:_queue, "delivery.queue"],
                    exchange: [:_exchange, "delivery.exchange"], routing_key: [:_routing_key, "delivery.routing_key"],
                    redelivered?: [:_redelivered?, "delivery.redelivered?"] }.freeze
        private_constant :READERS
        @warned = {}
        READERS.each do |name, (reader, instead)|
          define_method(name) do
            Consumed.deprecated(name, instead)
            __send__(reader)
          end
        end

        def self.deprecated(name, instead)
          return if @warned[name]

          @warned[name] = true
          warn("acemq: NativeDelivery##{name} is deprecated and will be removed: the delivery is the message now, " \
               "read message.#{instead}", uplevel: 2)
        end

        private

        def lazily(name)
          read = _read
          read.fetch(name) { read[name] = yield }
        end
      end
    end
  end
end
