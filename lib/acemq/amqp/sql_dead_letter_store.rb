# frozen_string_literal: true

require "acemq/amqp/sql"
require "acemq/amqp/sql_dead_letter_store/letter"
require "acemq/amqp/sql_dead_letter_store/ingester"

module AceMQ
  module AMQP
    # Dead letters as data: each {queue}.dlq ingested into a SQL table
    # (SQLite, PostgreSQL, MySQL/MariaDB), and the operator's work — browse,
    # filter, count, replay, discard, purge — done on the table. The rules
    # are core's (acemq::dead_letters); this adds the keywords.
    #
    #   store = AceMQ::AMQP::SQLDeadLetterStore.new(connection: db)  # or path: "dead.db"
    #   store.create_schema
    #   ingester = store.ingest(mq, "payments")    # a thread; ingester.stop
    #   page = store.list(queue: "payments", reason: "declined", limit: 50)
    #   store.replay(mq, ids: page.letters.map(&:id), actor: "ops@example.com", rate: 20)
    #
    # What it guarantees: a batch is committed, then acknowledged, so a kill
    # loses nothing; a row is unique on queue, message id and a content
    # hash, so a redelivery doubles nothing; one ingester per DLQ (an
    # exclusive consume; a second stands by); a replay sends the snapshot of
    # rows it was given, each once, paced, and never reads the DLQ.
    class SQLDeadLetterStore
      # The keywords every filter takes. since:/before: are Times (or
      # seconds since the epoch) on failed_at; reason: matches text
      # contained (case-blind for ASCII); the others are equal.
      FILTER_KEYS = %i[queue reason error_class type id since before].freeze

      # One page of #list: letters newest first, and the cursor of the next
      # page (after_id:), nil on the last.
      Page = Struct.new(:letters, :next_cursor)

      # connection: your database connection (a SQLite3::Database, a
      # PG::Connection, a Mysql2::Client, ActiveRecord's connection or pool,
      # or a callable returning one per call; see SQL.connect), or path: a
      # SQLite file the library opens itself. table:/audit_table: default to
      # acemq_dead_letters and acemq_dead_letter_audit. Writes run in
      # transactions of their own on it: not a connection another thread is
      # inside a transaction with.
      def self.new(connection: nil, path: nil, table: nil, audit_table: nil)
        if connection.nil? == path.nil?
          raise ConfigurationError, "SQLDeadLetterStore.new takes connection: (your database connection, or a callable " \
                                    "returning one) or path: (a SQLite file), exactly one of them"
        end

        _new(path&.to_s, (SQL.connect(connection) unless path), table&.to_s, audit_table&.to_s)
      end

      # The store a setting names (the runner's c.dead_letter_store, the
      # dashboard's, `acemq web --dead-letter-store`): one as it is;
      # :active_record for one on ActiveRecord::Base's pool (the tables
      # `acemq:install` migrates); a callable, called (by the runner in each
      # process, after any fork); a String, a postgres:// or mysql2:// URL
      # (a connection per thread, SQL.open_url) or a SQLite file's path. nil
      # for nil.
      def self.resolve(setting)
        return nil if setting.nil?
        return setting if store?(setting)
        return open(setting) if setting.is_a?(String)
        if setting == :active_record
          unless defined?(::ActiveRecord::Base)
            raise ConfigurationError, "dead_letter_store :active_record needs ActiveRecord loaded (the Rails app's environment)"
          end

          return new(connection: ::ActiveRecord::Base.connection_pool)
        end

        store = setting.respond_to?(:call) ? setting.call : setting
        return store if store?(store)

        raise ConfigurationError, "dead_letter_store is an AceMQ::AMQP::SQLDeadLetterStore, a callable returning one, " \
                                  ":active_record, or a database URL or SQLite path; got #{store.inspect[0, 80]}"
      end

      # A store on a postgres:// or mysql2:// URL (a connection per thread
      # that uses it: a web server's request threads), or on a SQLite file.
      def self.open(path_or_url, **options)
        if SQL.url?(path_or_url)
          url = path_or_url.to_s
          new(connection: SQL.per_thread { SQL.open_url(url) }, **options)
        else
          new(path: path_or_url.to_s.delete_prefix("sqlite://"), **options)
        end
      end

      def self.store?(value) = value.respond_to?(:ingest) && value.respond_to?(:list)

      # The DDL for "sqlite", "postgres" or "mysql", one statement per
      # element: what a migration runs. Idempotent (IF NOT EXISTS).
      def schema_sql(dialect) = _schema_sql(dialect.to_s)

      # Start ingesting queue's DLQ ("payments" reads payments.dlq) on a
      # thread of its own; returns the Ingester (#stop, #active?). Stands by
      # while another ingester, anywhere, has the DLQ, asking again every
      # retry_every: seconds. max_age: (seconds) and max_count: keep
      # queue's rows pruned every prune_every: seconds.
      def ingest(mq, queue, **options)
        Ingester.new(self, mq, queue.to_s, **options)
      end

      # One batch from an open DLQ feed into the table (the number of
      # deliveries committed and acknowledged): what an Ingester's loop runs,
      # so it need not reach into this class's natives. Not for
      # applications: undocumented.
      def ingest_batch(feed, max, linger, wait) = _ingest_batch(feed, max, linger, wait)

      # Take what queue's DLQ holds now into the table, until nothing comes
      # for idle: seconds; the number of deliveries committed and
      # acknowledged. Raises AccessRefused while an ingester has the DLQ.
      def ingest_once(mq, queue, prefetch: 200, batch: 100, idle: 0.5)
        feed = self.class._open_feed(mq, queue.to_s, whole(:prefetch, prefetch, 1, 65_535))
        total = 0
        begin
          loop do
            n = _ingest_batch(feed, whole(:batch, batch, 1, 10_000), 0.02, seconds(:idle, idle))
            break if n.zero?

            total += n
          end
        ensure
          feed.close
        end
        total
      end

      # One page, newest first: at most limit: (1 to 1,000) rows below
      # after_id: (the previous page's next_cursor). Rows that arrive
      # meanwhile never shift a page.
      def list(after_id: nil, limit: 50, **filter)
        letters, cursor = _list(filter_args(filter), after_id&.then { row_id(:after_id, _1) }, whole(:limit, limit, 1, 1_000))
        Page.new(letters.map { |h| Letter.new(**h) }, cursor)
      end

      # One Letter, or nil.
      def find(id)
        h = _find(row_id(:id, id))
        h && Letter.new(**h)
      end

      # How many match, grouped: { total:, by_queue: { "payments" => 3 },
      # by_reason: { "declined" => 2, nil => 1 }, by_error_class: {...} },
      # each group most first, the top: largest.
      def counts(top: 20, **filter) = _counts(filter_args(filter), whole(:top, top, 1, 1_000))

      # Replay ids: (row ids) or, without ids:, every row the filter
      # matches at this moment: each sent to its work queue (route:
      # :original sends it to the exchange and routing key it was first
      # published with) with a confirm, at rate: messages a second (default
      # 50), and deleted once confirmed. actor: is who asked, for the audit
      # table. Returns { id:, selected:, replayed:, skipped: } (skipped: gone
      # or held by another replay by its turn).
      def replay(mq, actor:, ids: nil, rate: nil, route: :queue, lease: nil, **filter)
        unless (route.is_a?(Symbol) || route.is_a?(String)) && %i[queue original].include?(route.to_sym)
          raise ConfigurationError, "replay route: is :queue (the default: the work queue) or :original (the exchange first published to)"
        end

        ids = ids&.then { |list| Array(list).map { row_id(:ids, _1) } }
        _replay(mq, ids, filter_args(filter), [rate&.then { seconds(:rate, _1) }, route.to_sym == :original, lease&.then { seconds(:lease, _1) }],
                actor.to_s)
      end

      # Delete these rows; the number deleted. Audited as actor:'s.
      def discard(ids, actor:) = _discard(Array(ids).map { row_id(:ids, _1) }, actor.to_s)

      # Delete every row the filter matches; the number deleted. A purge of
      # everything says so: all: true (true itself, not any truthy value).
      # Core refuses a filter that sets nothing, blank values counting as
      # unset (a form's empty reason field once purged every queue's rows).
      def purge(actor:, all: false, **filter) = _purge(filter_args(filter), all.equal?(true), actor.to_s)

      # Delete rows that failed more than max_age: seconds ago, and beyond
      # max_count: rows (of queue:, else of all), oldest first; the number
      # deleted, audited when any.
      def prune(max_age: nil, max_count: nil, queue: nil, actor: "acemq retention")
        _prune(queue&.to_s, max_age&.then { seconds(:max_age, _1) }, max_count&.then { whole(:max_count, _1, 0, 2**62) }, actor.to_s)
      end

      # The newest limit: audit rows, newest first: Hashes with id, at
      # (seconds since the epoch), actor, action (replay, discard, purge,
      # prune), queue, detail (what was asked) and count.
      def audit(limit: 50) = _audit(whole(:limit, limit, 1, 10_000))

      private

      def filter_args(filter)
        unknown = filter.keys - FILTER_KEYS
        unless unknown.empty?
          raise ConfigurationError, "unknown dead-letter filter #{unknown.map(&:inspect).join(', ')}: " \
                                    "filter by #{FILTER_KEYS.map { "#{_1}:" }.join(' ')}"
        end

        # Blank text is no filter (core's Filter::normalized); since: and
        # before: are Times (or seconds since the epoch), never a String
        # read as 0.
        text = ->(k) { filter[k].nil? ? nil : Connection.text(k, filter[k].to_s) }
        time = lambda do |k|
          v = filter[k]
          next nil if v.nil?
          if v.is_a?(Time) || v.is_a?(Integer) || (v.is_a?(Float) && v.finite?)
            n = v.to_i
            next n if n.between?(-2**62, 2**62)

            raise ConfigurationError, "#{k}: #{v.inspect[0, 40]} is out of range: give a Time (or seconds since the epoch)"
          end

          raise ConfigurationError, "#{k}: takes a Time (got #{v.inspect[0, 80]})"
        end
        [text.(:queue), text.(:reason), text.(:error_class), text.(:type), text.(:id), time.(:since), time.(:before)]
      end

      def whole(...) = self.class.whole(...)
      def row_id(name, value) = self.class.whole(name, value, -2**63, 2**63 - 1)
      def seconds(...) = self.class.seconds(...)

      # A whole number in lo..hi, or a ConfigurationError naming it (not
      # Ruby's RangeError, TypeError or ArgumentError from the conversion).
      # The store's and its ingester's options are read with these.
      def self.whole(name, value, lo, hi)
        n = value.is_a?(Float) ? nil : Integer(value, exception: false)
        return n if n&.between?(lo, hi)

        raise ConfigurationError, "#{name}: must be a whole number from #{lo} to #{hi} (got #{value.inspect[0, 80]})"
      end

      # Seconds (or a rate): a finite number, min or more.
      def self.seconds(name, value, min: 0)
        f = value.is_a?(Numeric) ? value.to_f : nil
        return f if f&.finite? && f >= min

        raise ConfigurationError, "#{name}: must be a number, #{min} or more (got #{value.inspect[0, 80]})"
      end
    end
  end
end
