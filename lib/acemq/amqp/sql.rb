# frozen_string_literal: true

require "acemq/amqp/sql/source"

module AceMQ
  module AMQP
    # The SQL seam, three methods wide. The stores' SQL is the engine's; what
    # runs it is a connection adapter answering
    #
    #   dialect               -> "sqlite", "postgres" or "mysql"
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
        name = Module.instance_method(:name)
        while error && seen < 8
          # The class's own name, not what an override of `name` says (one
          # that raised made this raise, and the handler's failure a
          # HandlerAborted without its class or message).
          return true if error.class.ancestors.any? { |a| UNAVAILABLE.include?(name.bind_call(a)) }

          error = error.cause
          seen += 1
        end
        false
      rescue StandardError
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
    end
  end
end

require "acemq/amqp/sql/sqlite"
require "acemq/amqp/sql/postgres"
require "acemq/amqp/sql/per_call"
require "acemq/amqp/sql/per_thread"
require "acemq/amqp/sql/connection_pool"
require "acemq/amqp/sql/pool_lease"
require "acemq/amqp/sql/raw_connection"
require "acemq/amqp/sql/mysql"
require "acemq/amqp/sql/url"
