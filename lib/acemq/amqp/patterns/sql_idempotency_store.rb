# frozen_string_literal: true

module AceMQ
  module AMQP
    module Patterns
      # Idempotency keys in a SQL table, with the engine's SQL for SQLite and
      # PostgreSQL: the claim is an INSERT that commits on its own, a stale
      # CLAIMED row is taken over after claim_timeout, a CONFIRMED row never
      # is, and nothing on the handling path deletes (schedule purge_expired).
      #
      #   SQLIdempotencyStore.new(connection: db)                        # your SQLite3::Database / PG::Connection
      #   SQLIdempotencyStore.new(connection: -> { Thread.current[:db] }) # one per call, from your pool
      #   SQLIdempotencyStore.new(path: "payments.db")                   # a SQLite file the library opens
      #
      # connection: is yours: the store runs its statements on it, on the
      # calling thread, inside whatever transaction it is in. A callable is
      # called once per store operation and must hand back a connection that
      # is already open — never one it opens for the call. path: opens the
      # file once (WAL, busy timeout) and releases the GVL around each
      # statement.
      #
      # The table (default core's DEFAULT_TABLE, acemq_idempotency) has
      # integer epoch-millisecond times (times: :epoch_ms, the table
      # create_schema makes). times: :datetime runs the same rules on the
      # datetime columns of the guide's ActiveRecord migration, in UTC, as
      # AceMQ::Rails::ActiveRecordIdempotencyStore does (docs/idempotency.md).
      #
      # retention: and claim_timeout: are seconds; what is left out is nil
      # here and core's default (DEFAULT_RETENTION, DEFAULT_CLAIM_TIMEOUT:
      # this class's constants of those names), the one a Rust service gets
      # too.
      class SQLIdempotencyStore
        def self.new(connection: nil, path: nil, table: nil, retention: nil, claim_timeout: nil, worker: nil,
                     times: :epoch_ms)
          if connection.nil? == path.nil?
            raise ConfigurationError, "SQLIdempotencyStore.new takes connection: (your database connection, or a " \
                                      "callable returning one) or path: (a SQLite file), exactly one of them"
          end

          retention = Patterns.seconds(:retention, retention) unless retention.nil?
          claim_timeout = Patterns.seconds(:claim_timeout, claim_timeout) unless claim_timeout.nil?
          table = table&.to_s
          worker = worker&.to_s
          adapter = SQL.connect(connection) unless path
          _new(path: path&.to_s, adapter: adapter, table: table, retention: retention, claim_timeout: claim_timeout,
               worker: worker, times: times.to_s)
        end

        # The statements create_schema runs, for a migration: dialect is
        # :sqlite or :postgres.
        def schema_sql(dialect) = _schema_sql(dialect.to_s)

        def inspect = "#<AceMQ::AMQP::Patterns::SQLIdempotencyStore table=#{table.inspect} worker=#{worker.inspect}>"
      end
    end
  end
end
