# frozen_string_literal: true

module AceMQ
  module AMQP
    module SQL
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
    end
  end
end
