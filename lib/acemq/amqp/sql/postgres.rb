# frozen_string_literal: true

require "monitor"

module AceMQ
  module AMQP
    module SQL
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
          # each row: a Ruby cast of every value made a relay's large claim
          # wait on Ruby, not on the database. Only numeric and boolean
          # columns, which no store query returns, are still cast in Ruby.
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
    end
  end
end
