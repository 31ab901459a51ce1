# frozen_string_literal: true

require "monitor"
require "acemq/amqp/sql/source"

module AceMQ
  module AMQP
    # The SQL seam, three methods wide. The stores' SQL is the engine's; what
    # runs it is a connection adapter answering
    #
    #   dialect               -> "sqlite" or "postgres"
    #   execute(sql, params)  -> Integer, the rows changed
    #   query(sql, params)    -> Array of rows, each an Array in SELECT order
    #
    # SQL.connect builds one from what the application already has,
    # recognising it by the methods it answers, never by its class (this gem
    # depends on no driver). An object that already answers all three is
    # used as it is, which is how another driver is wrapped.
    module SQL
      # SQL.connect was handed something it cannot drive.
      class UnsupportedConnection < ConfigurationError; end

      # A store was given a connection that has been closed: by the
      # application, or by sqlite3 2.x itself, which closes every writable
      # SQLite3::Database a process carried across fork() in the child.
      class ClosedConnection < StoreError; end

      # OUTAGE_WAIT (set by the extension from core's STORE_OUTAGE_WAIT): how
      # long a delivery whose handler found the database away waits round
      # the ladder without spending attempts, the same wait the idempotent
      # guard gives a delivery whose store failed.

      # Errors that say the database is away (down, restarting, the
      # connection killed, the file locked by another process or its disk
      # full), not that the message is bad. By name, because this gem loads
      # no driver.
      UNAVAILABLE = %w[
        PG::ConnectionBad PG::UnableToSend PG::AdminShutdown PG::CrashShutdown PG::CannotConnectNow
        ActiveRecord::ConnectionNotEstablished ActiveRecord::ConnectionFailed
        SQLite3::BusyException SQLite3::LockedException SQLite3::FullException
        Mysql2::Error::ConnectionError AceMQ::AMQP::SQL::ClosedConnection
      ].freeze

      # Is error (or what caused it: ActiveRecord wraps the driver's error,
      # a store wraps ActiveRecord's) one of UNAVAILABLE? A handler that
      # raised one is not retried but waits (see Subscription): retrying
      # would spend the attempts of valid messages while the database is
      # away and dead-letter them.
      def self.unavailable?(error)
        seen = 0
        while error && seen < 8
          return true if error.class.ancestors.any? { |a| UNAVAILABLE.include?(a.name) }

          error = error.cause
          seen += 1
        end
        false
      end

      # A Ruby driver object as the seam's adapter.
      def self.connect(connection)
        if adapter?(connection) then connection
        elsif connection.respond_to?(:exec_params) then Postgres.new(connection)
        elsif MySQL.client?(connection) then MySQL.new(connection)
        elsif connection.respond_to?(:execute) && connection.respond_to?(:changes) then SQLite.new(connection)
        elsif ConnectionPool.pool?(connection) then ConnectionPool.new(connection)
        elsif connection.respond_to?(:raw_connection) then RawConnection.new(connection)
        elsif connection.respond_to?(:call) then PerCall.new(connection)
        else
          raise UnsupportedConnection,
                "cannot use #{connection.class} as a SQL connection: give an object answering exec_params " \
                "(a PG::Connection), escape, affected_rows and query (a Mysql2::Client), execute and changes (a SQLite3::Database, also an ActiveRecord raw_connection), " \
                "with_connection (an ActiveRecord connection pool), raw_connection (ActiveRecord::Base.connection), " \
                "call (a callable returning an open connection per call), SQL.per_thread { open a connection }, " \
                "or dialect, execute(sql, params) and query(sql, params) (an adapter of your own)"
        end
      end

      # One connection per thread, opened by the block the first time a
      # thread needs one and kept for that thread:
      #
      #   SQLIdempotencyStore.new(connection: SQL.per_thread { SQLite3::Database.new("payments.db") })
      #
      # For the threads a consumer starts, which have no connection of the
      # application's (see PerThread).
      def self.per_thread(&open)
        raise ConfigurationError, "SQL.per_thread needs a block that opens a connection" unless open

        PerThread.new(&open)
      end

      def self.adapter?(obj)
        obj.respond_to?(:dialect) && obj.respond_to?(:execute) && obj.respond_to?(:query)
      end

      # Parameters as the driver should bind them. A String is bound as text
      # in UTF-8 whatever its encoding says: SQLite stores a binary
      # (ASCII-8BIT) string as a BLOB, and a BLOB never equals the TEXT of the
      # same bytes, so a key claimed from a delivery (binary) would never be
      # found from a console (UTF-8).
      def self.text(params)
        params.map do |p|
          next p unless p.is_a?(String)
          next p if p.encoding == Encoding::UTF_8

          p.encoding == Encoding::BINARY || p.ascii_only? ? p.dup.force_encoding(Encoding::UTF_8) : p.encode(Encoding::UTF_8)
        end
      end

      # SQLite3::Database, with results_as_hash true or false (an
      # ActiveRecord 6.1 raw_connection has it true). Rows are read from the
      # statement itself, which steps arrays in SELECT order whatever
      # results_as_hash says; a row that arrives as a Hash anyway is read by
      # column name, never by position.
      class SQLite
        def initialize(db)
          @db = db
        end

        def dialect = "sqlite"

        def execute(sql, params)
          open!
          @db.execute(sql, SQL.text(params))
          @db.changes
        end

        def query(sql, params)
          open!
          stmt = @db.prepare(sql)
          begin
            stmt.bind_params(*SQL.text(params)) unless params.empty?
            columns = stmt.columns
            rows = []
            stmt.each { |row| rows << (row.is_a?(Hash) ? columns.map { |c| row.fetch(c) } : row.to_a) }
            rows
          ensure
            stmt.close
          end
        end

        def inspect = "#<AceMQ::AMQP::SQL::SQLite #{@db.class}>"

        private

        # Without this a closed database reaches the store as the driver's
        # "prepare called on a closed database" (an ArgumentError), which
        # reads like a bug in the SQL. The usual way to get one is a fork:
        # sqlite3 2.x closes the parent's writable connections in the child
        # (SQLite's own rule: a connection must not cross a fork), where
        # 1.x went on using them.
        def open!
          return unless @db.closed?

          why = defined?(SQLite3::ForkSafety) ? " (sqlite3 2.x closes the writable connections a forked child inherits)" : ""
          raise ClosedConnection,
                "the #{@db.class} is closed#{why}: give the store a connection opened in this process, " \
                "e.g. connection: AceMQ::AMQP::SQL.per_thread { SQLite3::Database.new(\"payments.db\") }, " \
                "which opens a new one after a fork"
        end
      end

      # PG::Connection. Without a type map every column comes back as a
      # String; integers, floats and booleans are converted by the column's
      # type so the engine sees what the SQLite driver would give it.
      class Postgres
        INTEGER = [20, 21, 23, 26].freeze # int8, int2, int4, oid
        FLOAT = [700, 701].freeze         # float4, float8
        NUMERIC = 1700
        BOOLEAN = 16
        # Made on first use: PG is the application's to require.
        DECODERS = Hash.new do |h, type|
          h[type] = if INTEGER.include?(type) then PG::TextDecoder::Integer.new
                    elsif FLOAT.include?(type) then PG::TextDecoder::Float.new
                    end
        end

        def initialize(conn)
          @conn = conn
          # One statement at a time through this adapter. ruby-pg releases
          # the GVL while it waits on the server, so a second thread using
          # the same store (its backlog read while its relay sweeps) would
          # otherwise enter libpq on the same connection at once, which
          # crashes the process (seen in SSL_write); with this it waits.
          @lock = Monitor.new
        end

        def dialect = "postgres"

        def execute(sql, params)
          @lock.synchronize do
            result = @conn.exec_params(sql, SQL.text(params))
            n = result.cmd_tuples
            result.clear
            n.to_i
          end
        end

        def query(sql, params)
          @lock.synchronize { rows(@conn.exec_params(sql, SQL.text(params))) }
        end

        def inspect = "#<AceMQ::AMQP::SQL::Postgres #{@conn.class}>"

        private

        def rows(result)
          types = Array.new(result.nfields) { |i| result.ftype(i) }
          # Integers and floats are decoded by the driver, in C, as it reads
          # each row; a relay's claim of 1000 rows spent 3 ms in a Ruby cast
          # of every value. Only numeric and boolean columns, which no store
          # query returns, are still cast in Ruby.
          result.type_map = PG::TypeMapByColumn.new(types.map { |t| DECODERS[t] })
          rows = result.values
          types.each_with_index do |type, i|
            next unless type == NUMERIC || type == BOOLEAN

            rows.each { |row| row[i] = cast(row[i], type) }
          end
          rows
        ensure
          result.clear
        end

        def cast(value, type)
          return value unless value.is_a?(String)

          case type
          when *INTEGER then Integer(value, 10)
          when *FLOAT then Float(value)
          when NUMERIC then value.include?(".") ? Float(value) : Integer(value, 10)
          when BOOLEAN then value == "t" ? 1 : 0
          else value
          end
        end
      end

      # A callable (connection: -> { Thread.current[:db] ||= open_db }):
      # called once per store operation, on the calling thread, for the
      # connection to use for it — a pool checkout, or the thread's own. It
      # must return an open connection it keeps, never open one for the call:
      # a store operation is one statement or two, and a connect per message
      # is slower than the work. SQL.per_thread is that callable, written once.
      class PerCall
        include Source

        def initialize(callable)
          @callable = callable
        end

        # The adapter for one store operation (the engine calls this).
        def checkout
          conn = @callable.call
          # nil is what -> { Thread.current[:db] } gives on a thread where
          # nobody set it, which is every thread a consumer starts: say what
          # to write instead, since the message reaches a retry reason.
          if conn.nil?
            raise UnsupportedConnection,
                  "the connection: callable returned nil on thread #{Thread.current.name.inspect}: it must return an " \
                  "open connection on every thread that uses the store, and a consumer's handler runs on threads " \
                  "the subscription starts, where nothing of yours has set one. Open one per thread when first " \
                  "needed: connection: AceMQ::AMQP::SQL.per_thread { SQLite3::Database.new(\"payments.db\") }, or " \
                  "-> { Thread.current[:db] ||= SQLite3::Database.new(\"payments.db\") }"
          end
          if conn.is_a?(PerCall) || (!SQL.adapter?(conn) && conn.respond_to?(:call) &&
                                     !conn.respond_to?(:exec_params) && !conn.respond_to?(:changes))
            raise UnsupportedConnection, "the connection: callable returned #{conn.inspect}: it must return an open " \
                                         "database connection (a SQLite3::Database, a PG::Connection, a Mysql2::Client)"
          end

          SQL.connect(conn)
        end


        def inspect = "#<AceMQ::AMQP::SQL::PerCall #{@callable.inspect}>"
      end
    end
  end
end

require "acemq/amqp/sql/per_thread"
require "acemq/amqp/sql/connection_pool"
require "acemq/amqp/sql/pool_lease"
require "acemq/amqp/sql/raw_connection"
require "acemq/amqp/sql/mysql"
