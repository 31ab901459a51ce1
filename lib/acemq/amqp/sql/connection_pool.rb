# frozen_string_literal: true

module AceMQ
  module AMQP
    module SQL
      # A connection pool as a connection source: ActiveRecord::Base.
      # connection_pool, or anything answering with_connection,
      # lease_connection (or connection), active_connection? and
      # release_connection the way it does.
      #
      #   SQLIdempotencyStore.new(connection: ActiveRecord::Base.connection_pool)
      #
      # Each store operation gets a PoolLease (checkout), which takes a
      # connection from the pool for each statement and gives it back —
      # unless the thread already holds one, which is then the one used, and
      # with it the thread's transaction. A transaction the engine runs
      # (BEGIN … COMMIT: an outbox relay's claim) holds one connection
      # from its BEGIN to its end.
      class ConnectionPool
        include Source

        METHODS = %i[with_connection active_connection? release_connection].freeze

        # How a pool lends the calling thread a connection it keeps until
        # release_connection: lease_connection on Rails 7.2 and later, where
        # connection is deprecated (and gone in 8.0); connection on 6.1 to
        # 7.1, which have no lease_connection.
        LEASES = %i[lease_connection connection].freeze

        def self.pool?(obj) = METHODS.all? { |m| obj.respond_to?(m) } && LEASES.any? { |m| obj.respond_to?(m) }

        # The thread's connection from pool, leased until release_connection.
        def self.lease(pool) = pool.public_send(LEASES.find { |m| pool.respond_to?(m) })

        def initialize(pool)
          @pool = pool
          @dialect = nil
        end

        # The adapter for one store operation (the engine calls this).
        def checkout = PoolLease.new(@pool, dialect)

        # Every connection of one pool speaks the same SQL: asked once.
        def dialect
          @dialect ||= @pool.with_connection { |c| SQL.connect(c.raw_connection).dialect }
        end


        # The block with one of the pool's connections (the thread's own, if
        # it holds one) for all of its statements: SQLOutboxStore#add uses it,
        # because on SQLite the id of the row it inserted is asked for by a
        # second statement, which another connection would answer wrongly.
        def hold
          @pool.with_connection { |c| yield RawConnection.new(c) }
        end

        def inspect = "#<AceMQ::AMQP::SQL::ConnectionPool #{@pool.class}>"
      end
    end
  end
end
