# frozen_string_literal: true

require "acemq/amqp"

module AceMQ
  module Testing
    # What RecordingPublisher#batch yields: publishes collected until the
    # block returns, each with its envelope made at once by the connection
    # (so b.publish returns the envelope and raises EncodingError where the
    # connection's own Batch would).
    class RecordingBatch
      def initialize(connection)
        @connection = connection
        @items = []
      end

      def publish(payload, to:, exchange: "", envelope: nil, type: nil, headers: nil)
        _, env = @connection.__send__(:outgoing, payload, to, exchange, envelope, type, headers)
        @items << [payload, to, exchange, env]
        env
      end

      def size = @items.size

      # The collected publishes, emptying the batch.
      def take
        items = @items
        @items = []
        items
      end
    end
  end
end
