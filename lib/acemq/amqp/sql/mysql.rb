# frozen_string_literal: true

require "monitor"

module AceMQ
  module AMQP
    module SQL
      # Mysql2::Client (MySQL 8.0+, MariaDB 10.6+), also what an
      # ActiveRecord mysql2 raw_connection is.
      #
      # Parameters are quoted into the statement with the client's own
      # escape, as ActiveRecord's mysql2 adapter does for every query, rather
      # than bound by a server-side prepared statement: a prepare is a round
      # trip of its own before each execute, and a statement kept across
      # calls dies with its connection (mysql2's reconnect, a fork). escape
      # is the connection's (mysql_real_escape_string): it knows the
      # connection's character set and NO_BACKSLASH_ESCAPES.
      class MySQL
        def self.client?(obj) = obj.respond_to?(:escape) && obj.respond_to?(:affected_rows) && obj.respond_to?(:query)

        # The character set each client was found to speak, asked once per
        # client (an adapter is made for every store operation over an
        # ActiveRecord connection).
        CHARSETS = ObjectSpace::WeakMap.new

        def initialize(client)
          @client = client
          # mysql2 waits on the server without the GVL: two threads in one
          # client at once is "This connection is in use by" at best.
          @lock = Monitor.new
          utf8mb4!
        end

        def dialect = "mysql"

        def execute(sql, params)
          @lock.synchronize do
            @client.query(bind(sql, params))
            @client.affected_rows
          end
        end

        def query(sql, params)
          @lock.synchronize do
            result = @client.query(bind(sql, params), as: :array, cast_booleans: false)
            return [] if result.nil?

            result.to_a.each { |row| row.map! { |v| decimal?(v) ? number(v) : v } }
          end
        end

        def inspect = "#<AceMQ::AMQP::SQL::MySQL #{@client.class}>"

        private

        # mysql2's default, and MySQL's "utf8", is utf8mb3: three bytes at
        # most, so a body or key with an emoji fails mid-add with "Incorrect
        # string value". Refused here, where it can be said what to change.
        def utf8mb4!
          charset = CHARSETS[@client] ||= @lock.synchronize do
            @client.query("SELECT @@character_set_connection", as: :array).first.first.to_s
          end
          return if charset == "utf8mb4"

          raise ConfigurationError,
                "the MySQL connection's character set is #{charset}, which cannot carry four-byte UTF-8 " \
                "(an emoji in a body or a key): open it with Mysql2::Client.new(encoding: \"utf8mb4\", ...) " \
                "or encoding: utf8mb4 in database.yml"
        end

        # Each `?` replaced by its parameter, in one pass, so a `?` inside a
        # quoted value is never taken for a placeholder. The engine's SQL has
        # no `?` of its own inside a literal.
        def bind(sql, params)
          params = SQL.text(params)
          i = -1
          out = sql.gsub("?") { literal(params.fetch(i += 1)) }
          unless i + 1 == params.size
            raise ArgumentError, "#{params.size} parameters for #{i + 1} placeholders in #{sql[0, 80].inspect}"
          end

          out
        rescue IndexError
          raise ArgumentError, "#{params.size} parameters for more placeholders in #{sql[0, 80].inspect}"
        end

        def literal(v)
          case v
          when nil then "NULL"
          when Integer then v.to_s
          when Float
            raise ArgumentError, "cannot send #{v} to MySQL, which has no NaN or infinity" unless v.finite?

            v.to_s
          when true then "1"
          when false then "0"
          when String then "'#{@client.escape(v)}'"
          else raise ArgumentError, "cannot bind a #{v.class} as a MySQL parameter"
          end
        end

        # DECIMAL arrives as a BigDecimal: the engine reads integers and floats.
        def decimal?(v) = defined?(BigDecimal) && v.is_a?(BigDecimal)

        def number(v) = v.frac.zero? ? v.to_i : v.to_f
      end
    end
  end
end
