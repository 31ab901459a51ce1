# frozen_string_literal: true

module AceMQ
  module AMQP
    # Publishes collected by Connection#batch: sent together when the block
    # ends, and the block's return waits for every confirm at once. A failure
    # raises after every confirm has been waited for, so what did go out is
    # known to have gone out.
    class Batch
      def initialize(connection)
        @connection = connection
        @items = []
      end

      def publish(payload, to:, exchange: "", envelope: nil, type: nil, headers: nil)
        item, env = @connection.__send__(:outgoing, payload, to, exchange, envelope, type, headers)
        @items << item
        env
      end

      def size = @items.size

      # Send and wait; returns how many were published.
      def flush
        return 0 if @items.empty?

        items = @items
        @items = []
        @connection.__send__(:_publish_batch, items)
      end
    end
  end
end
