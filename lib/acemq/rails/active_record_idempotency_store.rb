# frozen_string_literal: true

require "socket"
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

      def worker
        @worker || begin
          pid = ":#{Process.pid}"
          "#{Socket.gethostname[0, WORKER_LIMIT - pid.size]}#{pid}"
        end
      end

      # Claim key: true exactly once while it is remembered. The claim is an
      # INSERT … ON CONFLICT DO NOTHING that commits on its own: a primary
      # key is the one thing two concurrent transactions cannot both win, so
      # the row appearing is the answer. DO NOTHING rather than a caught
      # RecordNotUnique, because on PostgreSQL a violation aborts whatever
      # transaction the connection is in.
      def first_time?(key)
        key = text(key)
        now = Time.now.utc
        operation("claim an idempotency key") do |conn|
          inserted = insert(conn, key, now)
          # Somebody has it. Take it over only if their claim has gone stale,
          # and never from a CONFIRMED row: that message really was handled.
          # The UPDATE's own WHERE decides between two takers (the first
          # moves recorded_at to now).
          inserted || @model.where(message_id: key, state: CLAIMED).where(recorded_at: ...(now - @claim_timeout))
                            .update_all(claimed_by: worker, recorded_at: now, expires_at: now + @retention)
                            .positive?
        end
      end

      # The handler finished: the claim becomes a fact no takeover touches.
      # Idempotent. Inside the handler's ActiveRecord::Base.transaction it
      # commits with the work.
      def confirm(key)
        key = text(key)
        operation("confirm an idempotency key") { @model.where(message_id: key).update_all(state: CONFIRMED) }
        nil
      end

      # The handler did not finish: drop this worker's own live claim so the
      # retry really runs. Never a CONFIRMED row, never another worker's.
      def forget(key)
        key = text(key)
        operation("forget an idempotency key") do
          @model.where(message_id: key, state: CLAIMED, claimed_by: worker).delete_all
        end
        nil
      end

      # Was key handled (not: is somebody working on it)? What lets the
      # guard retry a key that is only claimed instead of dropping it.
      def confirmed?(key)
        key = text(key)
        operation("read an idempotency key") { @model.where(message_id: key, state: CONFIRMED).exists? }
      end

      # Remove keys past their retention; how many went. Nothing on the
      # handling path deletes, so schedule this (the index on expires_at keeps
      # it from scanning the table).
      def purge_expired
        operation("purge expired idempotency keys") { @model.where(expires_at: ...Time.now.utc).delete_all }
      end

      def inspect
        "#<AceMQ::Rails::ActiveRecordIdempotencyStore table=#{table.inspect} worker=#{worker.inspect}>"
      end

      private

      # One connection for the operation: the thread's own if it holds one
      # (inside the handler's transaction, confirm is in it), else one lent
      # by the pool and given back after, so consumer threads do not each
      # keep a connection between messages.
      def operation(doing)
        @model.connection_pool.with_connection { |conn| yield conn }
      rescue ::ActiveRecord::ActiveRecordError => e
        raise AMQP::StoreError, "cannot #{doing} in table #{table}: #{e.class}: #{e.message} (check the " \
                                "acemq_idempotency migration has run on this database)"
      end

      # Did this INSERT add the row? MySQL has no ON CONFLICT, and its
      # ON DUPLICATE KEY UPDATE cannot answer: ActiveRecord's mysql2 connection
      # counts found rows (CLIENT_FOUND_ROWS), so a no-op update of an existing
      # key reports 1 like an insert. A plain INSERT's duplicate-key error is
      # the answer there, and on MySQL it undoes only the statement, never the
      # transaction around it.
      def insert(conn, key, now)
        return conn.exec_update(claim_sql(conn, key, now), "#{@model.name} Claim").positive? unless mysql?(conn)

        begin
          conn.exec_update(plain_insert_sql(conn, key, now), "#{@model.name} Claim")
          true
        rescue ::ActiveRecord::RecordNotUnique
          false
        end
      end

      def mysql?(conn) = conn.adapter_name.match?(/mysql|trilogy/i)

      def plain_insert_sql(conn, key, now)
        @model.sanitize_sql_array(
          ["INSERT INTO #{quoted_table(conn)} (message_id, state, claimed_by, recorded_at, expires_at) " \
           "VALUES (?, ?, ?, ?, ?)", key, CLAIMED, worker, now, now + @retention]
        )
      end

      # Quoted by the connection the statement runs on, not the model's
      # memoized quoted_table_name, which keeps the first adapter's quotes
      # (`t` or "t") for the life of the class even when ActiveRecord::Base
      # is connected to another kind of database later in the process.
      def quoted_table(conn) = conn.quote_table_name(@model.table_name)

      def claim_sql(conn, key, now)
        # ON CONFLICT (…) DO NOTHING is the same in SQLite (3.24+) and
        # PostgreSQL; the values are quoted by the connection, as
        # ActiveRecord would write them, so the times compare with the ones
        # update_all and where write.
        @model.sanitize_sql_array(
          ["INSERT INTO #{quoted_table(conn)} (message_id, state, claimed_by, recorded_at, expires_at) " \
           "VALUES (?, ?, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING",
           key, CLAIMED, worker, now, now + @retention]
        )
      end

      # A key is text. A binary string from a delivery and the UTF-8 string
      # of the same bytes are one key: SQLite would store the binary one as
      # a BLOB, which never equals the TEXT, and the console's lookup would
      # find nothing. Bytes that are not UTF-8 are refused rather than
      # replaced, because replacing them would make two keys one.
      def text(key)
        raise ArgumentError, "an idempotency key is required, got nil" if key.nil?

        s = AMQP::SQL.text([key.is_a?(String) ? key : key.to_s]).first
        unless s.valid_encoding?
          raise AMQP::EncodingError, "idempotency key #{s.inspect} is not UTF-8 text: give a key: that returns text " \
                                     "(hex-encode binary ids)"
        end
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

        @key_limit = operation("read the idempotency table") do
          column = @model.columns_hash["message_id"]
          # The generated migration's MySQL column is VARBINARY(255): bytes.
          [column&.limit, column&.type == :binary ? :bytes : :characters]
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
