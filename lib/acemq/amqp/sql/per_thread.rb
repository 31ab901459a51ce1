# frozen_string_literal: true

module AceMQ
  module AMQP
    module SQL
      # One connection per thread, opened by the block the first time that
      # thread needs one and reused by it after (SQL.per_thread builds it).
      #
      # A consumer's handler, and so the idempotency store it calls, runs on
      # threads the subscription starts. Nothing of the application's has
      # run there, so -> { Thread.current[:db] } finds nil; and one
      # connection shared by all of them is one connection used from several
      # threads at once, which no driver promises to survive. This is the
      # third way: each thread its own, opened once.
      #
      # Like a callable, it is asked for a connection once per store
      # operation (checkout), so an operation's statements, its BEGIN and its
      # COMMIT included, run on one connection.
      class PerThread
        include Source

        @ids = 0
        @ids_lock = Mutex.new

        # A number no other PerThread in this process has, so two stores with
        # two blocks never find each other's connections on a thread. Not
        # object_id: ids are reused after a collection.
        def self.next_id
          @ids_lock.synchronize { @ids += 1 }
        end

        def initialize(&open)
          @open = open
          @key = :"acemq_sql_per_thread_#{self.class.next_id}"
          @lock = Mutex.new
          @opened = [] # [pid, thread, connection]
        end

        # The calling thread's adapter, its connection opened now if it has
        # none yet.
        #
        # A PG connection that broke (the server restarted, its backend was
        # terminated) is closed and a new one opened here, so a relay or a
        # store on SQL.per_thread comes back by itself once the server is
        # back. Not PG::Connection#reset: when the server is still away,
        # ruby-pg 1.4 finishes the connection it failed to reset, and it can
        # never be used again. The statement that found it broken has raised
        # already (its transaction is gone); the next one gets the new one.
        def checkout
          pid, adapter, conn = Thread.current.thread_variable_get(@key)
          # A forked child inherits the forking thread's variables, and with
          # them the parent's connection: a SQLite handle or a PG socket used
          # from two processes corrupts both, so the child opens its own.
          return adapter if adapter && pid == Process.pid && !broken?(conn)

          forget(conn) if adapter && pid == Process.pid
          adapter, conn = open_for_thread
          Thread.current.thread_variable_set(@key, [Process.pid, adapter, conn])
          adapter
        end


        # How many connections are open for live threads of this process.
        def size
          @lock.synchronize { @opened.count { |pid, thread, _| pid == Process.pid && thread.alive? } }
        end

        # Close every connection this process opened (specs, shutdown). A
        # thread that uses it again opens a new one.
        def close
          opened = @lock.synchronize { @opened.slice!(0..) }
          opened.each { |pid, _, conn| close_connection(conn) if pid == Process.pid }
          # Threads still holding a closed one find nothing under the new key.
          @key = :"acemq_sql_per_thread_#{self.class.next_id}"
          nil
        end

        def inspect = "#<AceMQ::AMQP::SQL::PerThread open=#{size}>"

        private

        def open_for_thread
          conn = @open.call
          if conn.nil? || conn.is_a?(PerThread) || conn.is_a?(PerCall)
            raise UnsupportedConnection, "the SQL.per_thread block returned #{conn.inspect}: it must open and return " \
                                         "a database connection (a SQLite3::Database, a PG::Connection, a Mysql2::Client)"
          end

          adapter = SQL.connect(conn)
          @lock.synchronize do
            prune
            @opened << [Process.pid, Thread.current, conn]
          end
          [adapter, conn]
        end

        # libpq's own verdict (no round trip): CONNECTION_BAD once a
        # statement found the socket gone.
        def broken?(conn)
          conn.respond_to?(:finished?) && conn.respond_to?(:status) &&
            (conn.finished? || conn.status != PG::CONNECTION_OK)
        end

        def forget(conn)
          @lock.synchronize { @opened.reject! { |_, _, c| c.equal?(conn) } }
          close_connection(conn)
        end

        # A thread that ended took its thread variable with it, but not the
        # connection: close those here, so threads that come and go do not
        # pile up open connections. Another process's are only dropped: a
        # child closing the parent's PG connection would end the parent's
        # session.
        def prune
          @opened.reject! do |pid, thread, conn|
            next false if thread.alive? && pid == Process.pid

            close_connection(conn) if pid == Process.pid
            true
          end
        end

        def close_connection(conn)
          return if conn.respond_to?(:finished?) && conn.finished?

          conn.close if conn.respond_to?(:close) && !(conn.respond_to?(:closed?) && conn.closed?)
        rescue StandardError
          nil
        end
      end
    end
  end
end
