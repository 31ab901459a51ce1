# frozen_string_literal: true

module AceMQ
  module AMQP
    module SQL
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
