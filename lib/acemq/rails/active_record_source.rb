# frozen_string_literal: true

require "acemq/amqp/sql"

module AceMQ
  module Rails
    # A store's connection of its own, on the database an ActiveRecord model
    # is on, for a store that runs transactions of its own (the outbox
    # relay's claims and completions, a batch of idempotency claims):
    #
    #   SQLOutboxStore.new(**AceMQ::Rails::ActiveRecordSource.dedicated, table: "acemq_outbox")
    #
    # Never ActiveRecord's own connection: a thread of the application may be
    # inside a transaction on it (docs/outbox.md, "SQLite under
    # ActiveRecord"). The driver is recognised by the methods ActiveRecord's
    # connection answers, not by the adapter's name.
    module ActiveRecordSource
      class << self
        # A store's keywords: { path: } for SQLite — the file ActiveRecord
        # has open, which the library opens again (WAL, a busy timeout, no
        # GVL held while it waits) — or { connection: } for PostgreSQL and
        # MySQL: a SQL.per_thread of new connections with ActiveRecord's parameters,
        # one for each thread that uses the store, so the relay's thread and
        # a rake task's never share one.
        def dedicated(model = ::ActiveRecord::Base)
          raw = model.connection_pool.with_connection(&:raw_connection)
          if raw.respond_to?(:conninfo_hash) && raw.respond_to?(:exec_params)
            { connection: postgres(raw, search_path(model)) }
          elsif raw.respond_to?(:execute) && raw.respond_to?(:changes)
            { path: sqlite_file(raw) }
          elsif AMQP::SQL::MySQL.client?(raw) && raw.respond_to?(:query_options)
            { connection: mysql(raw) }
          else
            raise AMQP::SQL::UnsupportedConnection,
                  "#{model.name}'s database is on #{raw.class}: a store's connection of its own is built for " \
                  "SQLite, PostgreSQL and MySQL (mysql2); give the store connection: or path: yourself"
          end
        end

        private

        # The parameters libpq used for ActiveRecord's connection, exactly
        # (host, port, database, user, password, sslmode…), without having
        # to read database.yml the way ActiveRecord does.
        def postgres(raw, search_path)
          params = raw.conninfo_hash.reject { |_, v| v.nil? || v.to_s.empty? }
          driver = raw.class
          source = AMQP::SQL.per_thread do
            conn = driver.new(params)
            # ActiveRecord sets schema_search_path with SET after it
            # connects, so it is not in the parameters: without it the relay
            # looks for the table in another schema.
            conn.exec("SET search_path TO #{search_path}") if search_path
            conn
          end
          # What an outbox relay on this source LISTENs with (a channel is
          # per database, not per schema).
          source.define_singleton_method(:pg_conninfo) { params }
          source
        end

        # A new Mysql2::Client per thread with the options ActiveRecord's was
        # opened with (mysql2 keeps them in query_options: host, port,
        # database, username, password, encoding, flags, ssl...). ActiveRecord
        # sets the session's sql_mode and time zone after it connects; the
        # stores need neither (their times are epoch-millisecond integers).
        def mysql(raw)
          options = raw.query_options.dup
          driver = raw.class
          AMQP::SQL.per_thread { driver.new(options) }
        end

        def search_path(model)
          config = model.connection_db_config.configuration_hash
          (config[:schema_search_path] || config[:schema_order])&.to_s
        end

        # The absolute path of the main database, as SQLite itself has it
        # (database.yml's is relative to Rails.root).
        def sqlite_file(raw)
          main = AMQP::SQL.connect(raw).query("PRAGMA database_list", []).find { |_, name, _| name == "main" }
          file = main && main[2].to_s
          return file unless file.nil? || file.empty?

          raise AMQP::ConfigurationError,
                "ActiveRecord's SQLite database is in memory, so no other connection can see it: a store needs " \
                "one of its own on the same database; use a database file (database: db/development.sqlite3)"
        end
      end
    end
  end
end
