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
      # native: the engine's batch, which Connection#batch opens (its _batch)
      # and hands over, so the connection's natives stay its own.
      def initialize(connection, native, stream: false)
        @connection = connection
        @native = native
        @stream = stream
        @count = 0
      end

      # The payload is encoded straight into the message the engine keeps
      # (held) or sends (streamed); the options are read as a publish's,
      # partition_key: and partitions: among them (docs/ordering.md).
      def publish(payload, to:, exchange: "", envelope: nil, type: nil, headers: nil, delay: nil, at: nil,
                  partition_key: nil, partitions: nil)
        options = @connection.__send__(:publish_options, to, exchange, envelope, type, headers, delay: delay, at: at)
        partition = Connection.partition(partition_key, partitions)
        options[:partition] = partition if partition
        env = @native._push(payload, options)
        @count += 1
        env
      end

      def size = @count

      def streamed? = @stream

      # Send what is left and wait; returns how many were published.
      def flush = @native._finish

      # The block raised: a held batch sends nothing; a streamed one sends
      # what was published and waits for it, and the block's exception is
      # the one raised (a confirm's failure would only hide it).
      def abandon
        return @native._discard unless @stream

        begin
          @native._finish
        rescue StandardError
          nil
        end
      end
    end
  end
end
