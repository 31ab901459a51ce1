# frozen_string_literal: true

require "acemq/amqp/delivery"

module AceMQ
  module AMQP
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
    end
  end
end

# After Message: Consumed reopens the engine's subclass of it, and
# NativeDelivery's readers reopen Consumed. Neither file requires this one
# back (a circular require).
require "acemq/amqp/message/consumed"
require "acemq/amqp/native_delivery"
