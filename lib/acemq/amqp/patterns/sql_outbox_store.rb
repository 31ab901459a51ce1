# frozen_string_literal: true

module AceMQ
  module AMQP
    module Patterns
      # The transactional outbox in a SQL table, with the engine's SQL for
      # SQLite and PostgreSQL.
      #
      #   store = SQLOutboxStore.new(connection: db)   # the relay's connection
      #   store.create_schema
      #   db.transaction do
      #     orders.insert(order)
      #     store.add(Patterns.record(mq, event, to: "order.placed", exchange: "orders-events"), connection: db)
      #   end
      #
      # Two connections, and keeping them apart is the point. add writes with
      # the connection it is handed, inside whatever transaction that
      # connection is in, and never begins, commits or closes anything: roll
      # back and the message is gone with the work. Everything else (the
      # relay's claim and complete, backlog, stuck) runs on the store's own
      # connection: connection: (a SQLite3::Database with or without
      # results_as_hash, a PG::Connection, a callable returning one per call)
      # or path: (a SQLite file the library opens, WAL, GVL released). The
      # relay begins and commits transactions on it, so it must not be a
      # connection another thread is using for a transaction of its own.
      class SQLOutboxStore
        # lease: how long a claim keeps other relays off a row; it must
        # outlast a publish with its confirm, and it is how long a crashed
        # relay's rows wait. backoff: the wait after a row's first failure,
        # doubled per failure up to max_backoff:. worker: who claims
        # (default hostname:pid). What is left out is core's default
        # (OutboxStoreOptions::default(): lease, base_backoff, max_backoff).
        def self.new(connection: nil, path: nil, table: nil, worker: nil, lease: nil, backoff: nil, max_backoff: nil)
          if connection.nil? == path.nil?
            raise ConfigurationError, "SQLOutboxStore.new takes connection: (your database connection, or a callable " \
                                      "returning one) or path: (a SQLite file), exactly one of them"
          end

          secs = ->(name, v) { v.nil? ? nil : Patterns.seconds(name, v) }
          store = _new(path: path&.to_s, adapter: (SQL.connect(connection) unless path), table: table&.to_s,
                       worker: worker&.to_s, lease: secs.(:lease, lease), backoff: secs.(:backoff, backoff),
                       max_backoff: secs.(:max_backoff, max_backoff))
          store.instance_variable_set(:@pg_conninfo, pg_conninfo(connection)) if connection
          store
        end

        # The settings of a PostgreSQL store connection (a PG::Connection,
        # ActiveRecord's connection or pool), for the relay's LISTEN
        # connection; nil for anything else.
        def self.pg_conninfo(connection)
          return connection.pg_conninfo if connection.respond_to?(:pg_conninfo)

          raw = if connection.respond_to?(:conninfo_hash) then connection
                elsif connection.respond_to?(:raw_connection) then connection.raw_connection
                elsif connection.respond_to?(:with_connection) then connection.with_connection(&:raw_connection)
                end
          raw.respond_to?(:conninfo_hash) ? raw.conninfo_hash.compact.reject { |_, v| v.to_s.empty? } : nil
        rescue StandardError
          nil
        end
        private_class_method :pg_conninfo

        # What the relay LISTENs with by default: nil unless the store's
        # connection is PostgreSQL's.
        attr_reader :pg_conninfo

        # The PostgreSQL channel every add notifies at commit.
        def channel = _channel


        # Write record with connection: — the one holding your open
        # transaction — and return the row id. There is no default: a store
        # that used a connection of its own would commit the message on its
        # own, and a business write rolled back afterwards would leave a
        # message queued for something that never happened.
        def add(record, connection:)
          unless record.is_a?(OutboxRecord)
            raise ConfigurationError, "add takes a record built by Patterns.record, got #{record.class}"
          end

          adapter = SQL.connect(connection)
          # A pool lends a connection per statement; the insert and (on
          # SQLite) the question of its id must be asked of one.
          return adapter.hold { |one| _add(record, one) } if adapter.respond_to?(:hold)

          _add(record, adapter)
        end

        # A Patterns::OutboxBacklog: count (rows waiting, leased ones
        # included), oldest_age (seconds the oldest has waited, nil when
        # empty), stuck (rows that have failed at least once). A count that keeps growing means the
        # relay is not keeping up or not running; stuck above zero means a
        # destination keeps failing.
        def backlog
          b = _backlog
          OutboxBacklog.new(count: b.count, oldest_age: b.oldest_age, stuck: b.stuck)
        end

        # Up to limit rows that have failed at least once, oldest first:
        # where each is going, how often it failed and why: an Array of
        # Patterns::OutboxStuckRow. Times are the database's, as Time.
        def stuck(limit = 100)
          n = limit.is_a?(Float) ? nil : Integer(limit, exception: false)
          raise ConfigurationError, "stuck takes how many rows to list, 0 or more (got #{limit.inspect})" unless n && n >= 0 && n < 2**62

          _stuck(n).map { |r| OutboxStuckRow.from(r) }.freeze
        end

        # The statements create_schema runs, for a migration: dialect is
        # :sqlite or :postgres.
        def schema_sql(dialect) = _schema_sql(dialect.to_s)

        def inspect = "#<AceMQ::AMQP::Patterns::SQLOutboxStore table=#{table.inspect} worker=#{worker.inspect}>"
      end
    end
  end
end
