# frozen_string_literal: true

require "acemq/amqp/patterns"

module AceMQ
  module Rails
    # The idempotency store for an ActiveRecord application, on the guide's
    # table and migration (acemq_idempotency: message_id string primary key,
    # state, claimed_by, recorded_at and expires_at datetimes):
    #
    #   STORE = AceMQ::Rails::ActiveRecordIdempotencyStore.new
    #   AceMQ::AMQP::Patterns.idempotent(STORE) { |m| Payments.charge!(m.payload["order_id"]); accept }
    #
    # The guide's own store's rules — the claim is the INSERT, a stale CLAIMED
    # row is taken over and a CONFIRMED one never is, forget removes only this
    # worker's own claim, nothing on the handling path deletes — plus
    # confirmed?, which the guide's store lacks. With it the guard can tell a
    # key somebody is still working on (or died working on) from one that was
    # handled: the first is retried, the second accepted. Without it a
    # consumer killed mid-handler leaves a key that looks handled, and the
    # broker's redelivery is accepted without running: the message is lost.
    #
    # The rules and their SQL are the engine's, written once: this is
    # AMQP::Patterns::SQLIdempotencyStore with times: :datetime over the
    # model's connection pool. What it adds is the model (yours, or one on
    # table:) and the column's own key limit. Times are UTC, as ActiveRecord
    # writes them by default; an application on default_timezone :local is
    # refused, since its rows and the store's would disagree by the offset.
    #
    # Loaded only when ActiveRecord is; ActiveRecord::Base is first touched
    # when a store is built, not when this file is required, so requiring it
    # early in boot does not load ActiveRecord before its configuration.
    class ActiveRecordIdempotencyStore
      CLAIMED = "CLAIMED"
      CONFIRMED = "CONFIRMED"

      # Core's defaults (idempotency::DEFAULT_TABLE, DEFAULT_RETENTION and
      # DEFAULT_CLAIM_TIMEOUT, read through SQLIdempotencyStore), so a key
      # is remembered and a claim honoured as long here as in the engine's
      # store. Retention: longer than the longest a duplicate can take to
      # arrive (the top rung, a DLQ drained next week, a replay). Claim
      # timeout: longer than the slowest handler, or two consumers work on
      # one message at once; shorter than anybody's patience, because a dead
      # worker's claim holds its message back until then.
      DEFAULT_TABLE = AMQP::Patterns::SQLIdempotencyStore::DEFAULT_TABLE
      DEFAULT_RETENTION = AMQP::Patterns::SQLIdempotencyStore::DEFAULT_RETENTION
      DEFAULT_CLAIM_TIMEOUT = AMQP::Patterns::SQLIdempotencyStore::DEFAULT_CLAIM_TIMEOUT

      # The migration's claimed_by column is a string of 64.
      WORKER_LIMIT = 64

      @models = {}
      @models_lock = Mutex.new

      class << self
        # The model for table, one per table for the life of the process:
        # ActiveRecord keeps every subclass of Base it has seen, so a class per
        # store would be a class per store for ever.
        def model_for(table)
          unless defined?(::ActiveRecord::Base)
            raise AMQP::ConfigurationError, "#{self} works through ActiveRecord, which is not loaded: " \
                                            "require \"active_record\" first (a Rails app has), or use " \
                                            "AceMQ::AMQP::Patterns::SQLIdempotencyStore"
          end

          @models_lock.synchronize do
            @models[table] ||= Class.new(::ActiveRecord::Base) do
              self.table_name = table
              self.primary_key = "message_id"

              # Anonymous, but ActiveRecord names a model in its logs and
              # errors.
              def self.name = "AceMQ::Rails::ActiveRecordIdempotencyStore::Key"
              def self.to_s = name
            end
          end
        end
      end

      attr_reader :model, :retention, :claim_timeout

      # model: your own model on the table (a HandledMessage), or table:
      # (default acemq_idempotency) on ActiveRecord::Base's database.
      # retention: and claim_timeout: are seconds. worker: is written to
      # claimed_by; left out it is hostname:pid, read at each call so that a
      # forked child is another worker.
      def initialize(model: nil, table: nil, retention: DEFAULT_RETENTION, claim_timeout: DEFAULT_CLAIM_TIMEOUT,
                     worker: nil)
        if model && table
          raise AMQP::ConfigurationError, "give model: (your model on the table) or table: (its name), not both"
        end
        if model && !(model.respond_to?(:connection_pool) && model.respond_to?(:where) && model.respond_to?(:table_name))
          raise AMQP::ConfigurationError, "model: must be an ActiveRecord model on the idempotency table, got " \
                                          "#{model.inspect}"
        end

        @retention = positive(:retention, retention)
        @claim_timeout = positive(:claim_timeout, claim_timeout)
        @worker = worker && worker_id(worker)
        @model = model || self.class.model_for(table_name(table))
      end

      def table = @model.table_name

      # hostname:pid unless worker: was given (core's default, read at each
      # call, so a forked child is another worker).
      def worker = keys.worker

      # Claim key: true exactly once while it is remembered. The claim is
      # core's (SQLIdempotencyStore on the migration's datetime columns, in
      # UTC): an INSERT that commits on its own — a primary key is the one
      # thing two concurrent transactions cannot both win — that takes over a
      # CLAIMED row gone stale and never a CONFIRMED one, and never aborts
      # the caller's transaction when the key is taken (no violation is
      # raised; on MySQL an INSERT IGNORE, key by key).
      def first_time?(key) = keys.first_time?(text(key))

      # The handler finished: the claim becomes a fact no takeover touches.
      # Idempotent. Inside the handler's ActiveRecord::Base.transaction it
      # commits with the work: the statement runs on the thread's own
      # connection when it holds one.
      def confirm(key)
        keys.confirm(text(key))
        nil
      end

      # The handler did not finish: drop this worker's own live claim so the
      # retry really runs. Never a CONFIRMED row, never another worker's.
      def forget(key)
        keys.forget(text(key))
        nil
      end

      # Was key handled (not: is somebody working on it)? What lets the
      # guard retry a key that is only claimed instead of dropping it.
      def confirmed?(key) = keys.confirmed?(text(key))

      # Remove keys past their retention; how many went. Nothing on the
      # handling path deletes, so schedule this (the index on expires_at keeps
      # it from scanning the table).
      def purge_expired = keys.purge_expired

      def inspect
        "#<AceMQ::Rails::ActiveRecordIdempotencyStore table=#{table.inspect} worker=#{worker.inspect}>"
      end

      private

      # The engine's store over the model's connection pool: each statement
      # on the thread's own connection if it holds one, else on one the pool
      # lends for that statement. Built on first use, so that building a
      # store does not connect.
      def keys
        @keys ||= utc! && AMQP::Patterns::SQLIdempotencyStore.new(
          connection: @model.connection_pool, table: table, retention: @retention,
          claim_timeout: @claim_timeout, worker: @worker, times: :datetime
        )
      end

      # ActiveRecord.default_timezone (7.0 on), ActiveRecord::Base's (6.1).
      def utc!
        zone = if ::ActiveRecord.respond_to?(:default_timezone) then ::ActiveRecord.default_timezone
               else ::ActiveRecord::Base.default_timezone
               end
        return true if zone.nil? || zone.to_sym == :utc

        raise AMQP::ConfigurationError,
              "ActiveRecord's default_timezone is #{zone.inspect}: #{self.class} writes and compares the " \
              "migration's datetimes in UTC, ActiveRecord's default; set config.active_record.default_timezone " \
              "= :utc, or use SQLIdempotencyStore on a table of its own (integer times)"
      end

      # A key is text, and no longer than the column: the engine refuses
      # bytes that are not UTF-8 (EncodingError) and MySQL's 255 bytes; the
      # column's own limit is read here.
      def text(key)
        raise ArgumentError, "an idempotency key is required, got nil" if key.nil?

        s = AMQP::SQL.text([key.is_a?(String) ? key : key.to_s]).first
        limit, unit = key_limit
        size = unit == :bytes ? s.bytesize : s.length
        if limit && size > limit
          raise ArgumentError, "idempotency key is #{size} #{unit == :bytes ? 'bytes' : 'characters'} and " \
                               "#{table}.message_id holds #{limit}: key on something shorter (a digest of it, say)"
        end
        s
      end

      # The column's own limit (255 in the migration), so a key PostgreSQL
      # would refuse is refused on SQLite too, which does not enforce it.
      def key_limit
        return @key_limit if defined?(@key_limit)

        @key_limit = begin
          # Inside with_connection: on Rails 7.2 and later with
          # permanent_connection_checkout = :disallowed, reading the schema
          # outside it would check a connection out for good.
          column = @model.connection_pool.with_connection { @model.columns_hash["message_id"] }
          # The generated migration's MySQL column is VARBINARY(255): bytes.
          [column&.limit, column&.type == :binary ? :bytes : :characters]
        rescue ::ActiveRecord::ActiveRecordError => e
          raise AMQP::StoreError, "cannot read the idempotency table #{table}: #{e.class}: #{e.message} (check the " \
                                  "acemq_idempotency migration has run on this database)"
        end
      end

      def table_name(table)
        t = (table || DEFAULT_TABLE).to_s
        return t if t.match?(/\A[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?\z/)

        raise AMQP::ConfigurationError, "table: #{t.inspect} is not a plain table name: use letters, digits and " \
                                        "underscores (schema.table on PostgreSQL)"
      end

      def worker_id(worker)
        w = worker.to_s
        return w if !w.empty? && w.length <= WORKER_LIMIT

        raise AMQP::ConfigurationError, "worker: must be 1 to #{WORKER_LIMIT} characters (the claimed_by column), " \
                                        "got #{w.inspect}"
      end

      def positive(name, value)
        seconds = AMQP::Patterns.seconds(name, value)
        return seconds if seconds.positive?

        raise AMQP::ConfigurationError, "#{name}: must be more than 0 seconds, got #{value.inspect}"
      end
    end
  end
end
