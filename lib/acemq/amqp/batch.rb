# frozen_string_literal: true

module AceMQ
  module AMQP
    # Publishes collected by Connection#batch, their confirms awaited together
    # when the block ends. A failure raises after every confirm has been
    # waited for, so what did go out is known to have gone out.
    #
    # Held (the default): nothing is sent until the block returns, and a
    # block that raises sends nothing. Streamed (stream: true): each publish
    # goes out while the block builds the next (in chunks of CHUNK, on the
    # engine's own task, at most a few thousand unsent at a time), so the
    # broker is not idle while the block runs and a long batch is not held in
    # memory; a block that raises has sent what it published before the
    # raise, and its exception is raised once their confirms are in.
    class Batch
      # Messages handed to the engine at a time by a streamed batch: enough
      # that a handover is a small share of building them, few enough that
      # the broker has the first ones while the block builds the rest.
      CHUNK = 128

      def initialize(connection, stream: false)
        @connection = connection
        @items = []
        @stream = stream ? connection.__send__(:_stream) : nil
        @count = 0
      end

      def publish(payload, to:, exchange: "", envelope: nil, type: nil, headers: nil)
        item, env = @connection.__send__(:outgoing, payload, to, exchange, envelope, type, headers)
        @items << item
        hand_over if @stream && @items.size >= CHUNK
        env
      end

      def size = @count + @items.size

      def streamed? = !@stream.nil?

      # Send what is left and wait; returns how many were published.
      def flush
        return finish_stream if @stream
        return 0 if @items.empty?

        items = @items
        @items = []
        @connection.__send__(:_publish_batch, items)
      end

      # The block raised: a held batch sends nothing; a streamed one sends
      # what was published and waits for it, and the block's exception is
      # the one raised (a confirm's failure would only hide it).
      def abandon
        return @items.clear unless @stream

        begin
          finish_stream
        rescue StandardError
          nil
        end
      end

      private

      def hand_over
        items = @items
        @items = []
        @count += items.size
        @stream._send(items)
      end

      def finish_stream
        hand_over unless @items.empty?
        @stream._finish
      end
    end
  end
end
