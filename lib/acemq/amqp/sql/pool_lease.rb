# frozen_string_literal: true

module AceMQ
  module AMQP
    module SQL
      # A pool's connections for one store operation (ConnectionPool#checkout
      # makes one per operation). A statement on its own runs on a connection
      # the pool lends for that statement — the thread's own when it holds
      # one, so a store called inside ActiveRecord::Base.transaction writes
      # in that transaction. A transaction the engine opens holds one
      # connection from BEGIN to COMMIT or ROLLBACK: on any other, its
      # statements would commit one by one and its COMMIT end nothing.
      class PoolLease
        # The engine's transaction statements (BEGIN, BEGIN IMMEDIATE,
        # COMMIT, ROLLBACK); a savepoint's ROLLBACK TO is not an end.
        BEGINS = /\A\s*(BEGIN|START\s+TRANSACTION)\b/i.freeze
        ENDS = /\A\s*(COMMIT|END|ROLLBACK)(\s+TRANSACTION)?\s*;?\s*\z/i.freeze

        attr_reader :dialect

        def initialize(pool, dialect)
          @pool = pool
          @dialect = dialect
          @held = nil
          @fresh = false
        end

        def execute(sql, params) = run(sql) { |a| a.execute(sql, params) }
        def query(sql, params) = run(sql) { |a| a.query(sql, params) }

        def inspect = "#<AceMQ::AMQP::SQL::PoolLease #{@held ? 'in a transaction' : 'per statement'}>"

        private

        def run(sql, &block)
          return in_transaction(sql, &block) if @held || BEGINS.match?(sql)

          @pool.with_connection { |c| yield SQL.connect(c.raw_connection) }
        end

        def in_transaction(sql)
          beginning = @held.nil?
          hold if beginning
          ending = ENDS.match?(sql)
          begin
            result = yield SQL.connect(@held.raw_connection)
          rescue StandardError
            # A failed BEGIN gets no ROLLBACK from the engine, so nothing
            # else would give the connection back. A statement failing inside
            # the transaction does: the engine's ROLLBACK comes next.
            give_back if beginning || ending
            raise
          rescue Exception # rubocop:disable Lint/RescueException
            # Thread#kill, Interrupt, throw: the engine calls no more Ruby
            # for this operation, so its ROLLBACK never comes. End the
            # transaction here, or the pool gets back a connection inside one.
            abort_transaction unless ending
            give_back
            raise
          end
          give_back if ending
          result
        end

        def hold
          @fresh = !@pool.active_connection?
          conn = ConnectionPool.lease(@pool)
          if conn.respond_to?(:transaction_open?) && conn.transaction_open?
            @pool.release_connection if @fresh
            # On PostgreSQL a second BEGIN is only a warning, and the
            # engine's COMMIT would then commit the application's
            # transaction half way through.
            raise StoreError, "this operation runs a transaction of its own (an outbox relay's claim or " \
                              "completion), and this thread's ActiveRecord connection is inside one: call it " \
                              "outside ActiveRecord::Base.transaction, or give the store a connection of its own"
          end
          @held = conn
        end

        def abort_transaction
          SQL.connect(@held.raw_connection).execute("ROLLBACK", [])
        rescue StandardError
          nil
        end

        def give_back
          @pool.release_connection if @fresh
        ensure
          @held = nil
          @fresh = false
        end
      end
    end
  end
end
