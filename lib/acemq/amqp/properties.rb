# frozen_string_literal: true

module AceMQ
  module AMQP
    # Every AMQP basic property a delivery arrived with, by name:
    # `message.delivery.properties.correlation_id`. Unset ones are nil:
    # `timestamp` is nil (not 0, not 1970) when the publisher set none, and
    # `delivery_mode` nil when it said neither 1 nor 2. `headers` holds
    # every header as it arrived, the `x-acemq-*` ones included (the
    # envelope's `headers` leaves those out); a header sent as an AMQP byte
    # array is a binary (ASCII-8BIT) String here and in `message.headers`.
    #
    # Retry and dead-letter copies keep every property but three; see
    # docs/retries.md ("What a copy keeps").
    Properties = Struct.new(:content_type, :content_encoding, :headers, :delivery_mode, :priority, :correlation_id,
                            :reply_to, :expiration, :message_id, :timestamp, :type, :user_id, :app_id, :cluster_id,
                            keyword_init: true) do
      def persistent? = delivery_mode == 2

      # The timestamp as a Time, nil when there is none.
      def time = timestamp && Time.at(timestamp)
    end
  end
end
