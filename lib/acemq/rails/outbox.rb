# frozen_string_literal: true

require "acemq/amqp/patterns"

module AceMQ
  module Rails
    # The transactional outbox for an ActiveRecord application: rows added
    # on the caller's ActiveRecord connection, in its transaction, and a
    # relay whose store has a connection of its own.
    #
    #   OUTBOX = AceMQ::Rails::Outbox.new            # acemq_outbox, ActiveRecord::Base's database
    #
    #   ActiveRecord::Base.transaction do
    #     order.save!
    #     OUTBOX.add(AceMQ::AMQP::Patterns.record(mq, event, to: "order.placed", exchange: "orders-events"))
    #   end                                          # roll back, and the row goes with the order
    #
    #   relay = OUTBOX.relay(mq, interval: 1)        # in the process that publishes
    #   relay.start
    #
    # One mechanism: add is SQLOutboxStore#add over the SQL seam, handed
    # ActiveRecord's connection; the SQL is the engine's. Two connections,
    # and keeping them apart is the point: the relay begins and commits
    # transactions of its own, which on a connection a request is using are a
    # "cannot start a transaction within a transaction" at best and the
    # request's half-done writes committed by the relay at worst.
    class Outbox
      # model: whose database the outbox is in (default ActiveRecord::Base);
      # table: (default acemq_outbox); worker:, lease:, backoff: and
      # max_backoff: are SQLOutboxStore's.
      def initialize(model: nil, table: nil, **store_options)
        unknown = store_options.keys - %i[worker lease backoff max_backoff]
        unless unknown.empty?
          raise AMQP::ConfigurationError, "unknown Outbox option(s) #{unknown.join(', ')}: use model:, table:, " \
                                          "worker:, lease:, backoff:, max_backoff:"
        end
        if model && !model.respond_to?(:connection_pool)
          raise AMQP::ConfigurationError, "model: must be an ActiveRecord class (ActiveRecord::Base, or an abstract " \
                                          "class of yours for another database), got #{model.inspect}"
        end

        @model = model
        @options = store_options.merge(table: table).compact
        @lock = Mutex.new
        @relay_store = nil
        @per_thread = nil
        @pid = nil
      end

      # Write record with this thread's ActiveRecord connection, in whatever
      # transaction it is in, and return the row id. Nothing is begun,
      # committed or closed.
      #
      # Through the pool's with_connection, not model.connection: that is
      # a permanent checkout, which Rails 7.2 refuses under
      # ActiveRecord.permanent_connection_checkout = :disallowed. Inside a
      # transaction the thread holds its connection, and with_connection
      # lends that one (so the row is in the transaction); outside one it
      # lends a connection for this add and takes it back, where
      # model.connection kept it for the rest of the request.
      def add(record)
        model.connection_pool.with_connection { |conn| writer.add(record, connection: conn) }
      end

      # The relay's store, on a connection of its own on ActiveRecord's
      # database (ActiveRecordSource.dedicated): SQLite, the same file by
      # path:; PostgreSQL, a connection per thread that uses it, opened with
      # the parameters of ActiveRecord's. Built once per process: a forked
      # child must not use its parent's connection, so it builds its own.
      def store
        @lock.synchronize do
          build_relay_store unless @relay_store && @pid == Process.pid
          @relay_store
        end
      end

      # An OutboxRelay over store (options are OutboxRelay's: interval:,
      # batch_size:, on_error:).
      def relay(mq, **options) = AMQP::Patterns::OutboxRelay.new(mq, store, **options)

      # Create the table (development and tests; a migration owns it in
      # production: store.schema_sql(:postgres) gives the statements).
      def create_schema = store.create_schema

      # The relay store's (SQLOutboxStore#backlog and #stuck): a
      # Patterns::OutboxBacklog, and an Array of Patterns::OutboxStuckRow.
      def backlog = store.backlog
      def stuck(limit = 100) = store.stuck(limit)

      # Close the relay store's PostgreSQL connections (a SQLite store's
      # file closes with it).
      def close
        @lock.synchronize do
          @per_thread&.close
          @relay_store = nil
        end
        nil
      end

      def model
        return @model if @model
        return ::ActiveRecord::Base if defined?(::ActiveRecord::Base)

        raise AMQP::ConfigurationError, "AceMQ::Rails::Outbox works through ActiveRecord, which is not loaded: " \
                                        "require \"active_record\" first (a Rails app has), or use " \
                                        "AceMQ::AMQP::Patterns::SQLOutboxStore"
      end

      def inspect = "#<AceMQ::Rails::Outbox table=#{(@options[:table] || 'acemq_outbox').inspect}>"

      private

      # add's store: only its table and statements are used (add writes on
      # the connection it is handed), so it sits on the pool and opens
      # nothing — a web process that only adds never opens a relay's
      # connection.
      def writer
        @writer ||= AMQP::Patterns::SQLOutboxStore.new(connection: model.connection_pool, **@options)
      end

      def build_relay_store
        source = ActiveRecordSource.dedicated(model)
        @per_thread = source[:connection]
        @relay_store = AMQP::Patterns::SQLOutboxStore.new(**source, **@options)
        @pid = Process.pid
      end
    end
  end
end

require "acemq/rails/active_record_source"
