# frozen_string_literal: true

module AceMQ
  module AMQP
    # Where a delivery came from.
    Delivery = Struct.new(:queue, :exchange, :routing_key, :redelivered, keyword_init: true) do
      def redelivered? = !!redelivered
    end

    # One message as a handler sees it: the parsed JSON payload, the
    # envelope, and the delivery it arrived by (nil for a message built by
    # hand in a spec).
    class Message
      attr_reader :payload, :envelope, :delivery

      def initialize(payload:, envelope: Envelope.new, delivery: nil)
        @payload = payload
        @envelope = envelope
        @delivery = delivery
        freeze
      end

      # Built from what NativeConsumer#_next hands over.
      def self.from_native(d)
        envelope = Envelope.new(id: d[2], type: d[3], origin: d[4], timestamp: d[5], attempt: d[6], headers: d[7])
        delivery = Delivery.new(queue: d[8], exchange: d[9], routing_key: d[10], redelivered: d[11])
        new(payload: d[1], envelope: envelope, delivery: delivery)
      end

      def id = envelope.id
      def type = envelope.type
      def attempt = envelope.attempt
      def headers = envelope.headers

      def inspect
        "#<AceMQ::AMQP::Message id=#{envelope.id.inspect} type=#{envelope.type.inspect} payload=#{payload.inspect}>"
      end
    end
  end
end
