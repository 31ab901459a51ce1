# frozen_string_literal: true

require "json"
require "acemq/amqp"

module AceMQ
  module Testing
    # One publish the kit's publisher saw: where it went, its envelope, and
    # the payload both as the code handed it over and as a consumer will
    # receive it (through JSON, so symbol keys arrive as strings).
    #
    # routed? is false for a publish nothing on the test's broker took
    # (see RecordingPublisher). A publish refused (a payload that is not
    # JSON) is kept too, with its error, so a matcher's failure message can
    # say why nothing was published; it does not count as published.
    class Published
      attr_reader :payload, :sent, :exchange, :to, :envelope, :error

      def initialize(sent:, to:, exchange:, envelope:, routed: true, error: nil)
        @sent = sent
        @payload = decode(sent, error)
        @to = to.to_s.freeze
        @exchange = exchange.to_s.freeze
        @envelope = envelope
        @error = error
        @routed = routed && error.nil?
        freeze
      end

      def refused? = !@error.nil?
      def routed? = @routed

      def type = envelope&.type
      def id = envelope&.id
      def headers = envelope ? envelope.headers : {}

      # The message a consumer bound to it would be handed, to pass on to
      # `deliver` or straight to a handler's #call.
      def message
        AMQP::Message.new(payload: payload, envelope: envelope,
                          delivery: AMQP::Delivery.new(queue: exchange.empty? ? to : nil, exchange: exchange,
                                                       routing_key: to, redelivered: false))
      end

      def inspect
        where = exchange.empty? ? "to #{to.inspect}" : "on #{exchange.inspect} to #{to.inspect}"
        text = +where
        text << " type=#{type.inspect}" if type
        text << " payload=#{(refused? ? sent : payload).inspect}"
        text << " headers=#{headers.inspect}" unless headers.empty?
        text << " (unrouted: nothing in this test takes it)" unless routed? || refused?
        text << " (refused: #{error.class.name}: #{error.message})" if refused?
        text
      end
      alias to_s inspect

      private

      # A payload that could not be encoded was never sent: nothing to decode.
      def decode(sent, error)
        return nil if error.is_a?(AMQP::EncodingError)

        JSON.parse(JSON.generate(sent))
      rescue JSON::JSONError, TypeError, ArgumentError
        nil
      end
    end
  end
end
