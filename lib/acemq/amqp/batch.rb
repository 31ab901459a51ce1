# frozen_string_literal: true

module AceMQ
  module AMQP
    # Publishes collected by Connection#batch, their confirms awaited together
    # when the block ends. A failure raises after every confirm has been
    # waited for, so what did go out is known to have gone out.
    #
    # Held (the default): nothing is sent until the block returns, and a
    # block that raises sends nothing. Streamed (stream: true): each publish
    # goes out while the block builds the next (in the engine's chunks, on
    # its own task, at most a few thousand unsent at a time), so the
    # broker is not idle while the block runs and a long batch is not held in
    # memory; a block that raises has sent what it published before the
    # raise, and its exception is raised once their confirms are in.
    class Batch
      def initialize(connection, stream: false)
        @connection = connection
        @items = []
        @stream = stream ? connection.__send__(:_stream) : nil
        @count = 0
      end

      def publish(payload, to:, exchange: "", envelope: nil, type: nil, headers: nil)
        return push(payload, to, exchange, envelope, type, headers) if @stream

        item, env = @connection.__send__(:outgoing, payload, to, exchange, envelope, type, headers)
        @items << item
        env
      end

      def size = @stream ? @count : @items.size

      def streamed? = !@stream.nil?

      # Send what is left and wait; returns how many were published.
      def flush
        return @stream._finish if @stream
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
          @stream._finish
        rescue StandardError
          nil
        end
      end

      private

      # Built and handed to the engine's stream at once: it sends in chunks
      # of its own (core's STREAM_CHUNK) and waits here only when a few
      # thousand are unsent.
      def push(payload, to, exchange, envelope, type, headers)
        env = @stream._push(*@connection.__send__(:prepare, payload, to, exchange, envelope, type, headers))
        @count += 1
        env
      end
    end
  end
end
