# frozen_string_literal: true

module AceMQ
  module AMQP
    module SQL
      # An object that owns a driver connection and hands it out with
      # raw_connection: ActiveRecord::Base.connection (an ActiveRecord
      # connection adapter).
      #
      #   store.add(record, connection: ActiveRecord::Base.connection)
      #
      # The driver connection is asked for at each store operation, never
      # kept: ActiveRecord replaces it when it reconnects, and asking is what
      # makes ActiveRecord send the BEGIN of a transaction it has opened but
      # not yet begun (it begins lazily, at the first statement), so that a
      # row added first thing in ActiveRecord::Base.transaction is in it.
      class RawConnection
        include Source

        def initialize(owner)
          @owner = owner
        end

        # The adapter for one store operation (the engine calls this).
        def checkout
          raw = @owner.raw_connection
          if raw.nil? || raw.equal?(@owner) || raw.respond_to?(:raw_connection)
            raise UnsupportedConnection, "#{@owner.class}#raw_connection returned #{raw.class}: it must return the " \
                                         "driver's connection (a SQLite3::Database, a PG::Connection, a Mysql2::Client)"
          end

          SQL.connect(raw)
        end


        def inspect = "#<AceMQ::AMQP::SQL::RawConnection #{@owner.class}>"
      end
    end
  end
end
