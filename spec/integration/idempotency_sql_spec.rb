# frozen_string_literal: true

require "time"
require "spec_helper"
require "acemq/amqp/patterns"
require "sqlite3"
require "pg"

module IdempotencySQLSpec
  Patterns = AceMQ::AMQP::Patterns
  Ack = AceMQ::AMQP::Ack

  def self.message(id, payload = { "order_id" => "A-1" })
    AceMQ::AMQP::Message.new(payload: payload, envelope: AceMQ::AMQP::Envelope.new(id: id, type: "payment.due.v1"))
  end

  # Every backend passes the same examples. The including group defines
  # store(**options) (same table each call, so two stores are two workers on
  # one table) and stored_type(key) (the SQL type the key was stored as).
  RSpec.shared_examples "a SQL idempotency store" do
    let(:a) { store(worker: "worker-a") }

    it "claims a key once, then confirms it" do
      expect(a.first_time?("m-1")).to be(true)
      expect(a.first_time?("m-1")).to be(false)
      expect(a.confirmed?("m-1")).to be(false)
      a.confirm("m-1")
      a.confirm("m-1") # idempotent
      expect(a.confirmed?("m-1")).to be(true)
      expect(a.first_time?("m-1")).to be(false)
    end

    it "forgets only this worker's own live claim, never a confirmed key" do
      b = store(worker: "worker-b")
      a.first_time?("mine")
      b.forget("mine")
      expect(b.first_time?("mine")).to be(false)
      a.forget("mine")
      expect(b.first_time?("mine")).to be(true)

      a.first_time?("done")
      a.confirm("done")
      a.forget("done")
      expect(a.confirmed?("done")).to be(true)
    end

    it "takes over a stale claim after claim_timeout, and never a confirmed key" do
      a = store(worker: "worker-a", claim_timeout: 0.3)
      b = store(worker: "worker-b", claim_timeout: 0.3)
      a.first_time?("stale")
      a.first_time?("done")
      a.confirm("done")
      expect(b.first_time?("stale")).to be(false)

      eventually(timeout: 3) { b.first_time?("stale") }
      expect(a.first_time?("stale")).to be(false) # b's claim is live now
      expect(b.first_time?("done")).to be(false)
    end

    it "treats a binary key and the UTF-8 key as one key, stored as text" do
      expect(a.first_time?("m-2".b)).to be(true)
      expect(a.first_time?("m-2")).to be(false)
      a.confirm("m-2".b)
      expect(a.confirmed?("m-2")).to be(true)
      expect(stored_type("m-2")).to eq(respond_to?(:key_type) ? key_type : "text")
    end

    it "purges keys past their retention and says how many" do
      s = store(retention: 0.2)
      s.first_time?("old")
      s.confirm("old")
      expect(s.purge_expired).to eq(0)
      eventually(timeout: 3) { s.purge_expired == 1 }
      expect(s.first_time?("old")).to be(true)
    end

    it "guards a handler through Patterns.idempotent" do
      charged = []
      handler = Patterns.idempotent(a) { |m| charged << m.id; Ack.accept }
      3.times { handler.call(IdempotencySQLSpec.message("m-3")) }
      expect(charged).to eq(["m-3"])
      expect(a.confirmed?("m-3")).to be(true)
      expect(handler.stats[:duplicates]).to eq(2)
    end
  end

  RSpec.shared_examples "the transaction question" do
    # The handler confirms inside its own transaction, as the guide shows:
    # the work and the confirmed key commit together, or neither does.
    def guarded(store, fail_after_work: false)
      Patterns.idempotent(store) do |m|
        transaction do
          record_charge(m.id)
          store.confirm(m.envelope.id)
          raise "card declined after the insert" if fail_after_work
        end
        Ack.accept
      end
    end

    it "commits the work and the confirmed key in one transaction" do
      s = store
      expect(guarded(s).call(IdempotencySQLSpec.message("t-1"))).to be_accept
      expect(charges("t-1")).to eq(1)
      expect(s.confirmed?("t-1")).to be(true)
    end

    it "rolls back both, and forgets the claim so the retry runs" do
      s = store
      expect { guarded(s, fail_after_work: true).call(IdempotencySQLSpec.message("t-2")) }
        .to raise_error(RuntimeError, /card declined/)
      expect(charges("t-2")).to eq(0)
      expect(s.confirmed?("t-2")).to be(false)
      expect(s.first_time?("t-2")).to be(true)
    end
  end

  RSpec.shared_context "a SQLite file through the sqlite3 driver" do |results_as_hash|
    let(:path) { sqlite_path }
    let(:db) { sqlite_db(path, results_as_hash: results_as_hash) }
    after { db.close }

    def store(**options)
      Patterns::SQLIdempotencyStore.new(connection: db, **options).tap(&:create_schema)
    end

    def stored_type(key)
      row = db.execute("SELECT typeof(message_id) FROM acemq_idempotency WHERE message_id = ?", [key]).first
      row.is_a?(Hash) ? row.values.first : row.first
    end

    def transaction(&block) = db.transaction(&block)

    def record_charge(key)
      db.execute("CREATE TABLE IF NOT EXISTS charges (key TEXT NOT NULL)")
      db.execute("INSERT INTO charges (key) VALUES (?)", [key])
    end

    def charges(key)
      db.execute("CREATE TABLE IF NOT EXISTS charges (key TEXT NOT NULL)")
      row = db.execute("SELECT count(*) AS n FROM charges WHERE key = ?", [key]).first
      row.is_a?(Hash) ? row["n"] : row.first
    end
  end

  RSpec.describe "SQLIdempotencyStore on a SQLite3::Database (results_as_hash false)" do
    include_context "a SQLite file through the sqlite3 driver", false
    it_behaves_like "a SQL idempotency store"
    it_behaves_like "the transaction question"

    it "binds a binary key as text through the driver adapter itself" do
      adapter = AceMQ::AMQP::SQL.connect(db)
      adapter.execute("CREATE TABLE k (k TEXT)", [])
      expect(adapter.execute("INSERT INTO k VALUES (?)", ["a".b])).to eq(1)
      expect(adapter.query("SELECT typeof(k), k FROM k WHERE k = ?", ["a"])).to eq([%w[text a]])
    end
  end

  RSpec.describe "SQLIdempotencyStore on a SQLite3::Database with results_as_hash" do
    include_context "a SQLite file through the sqlite3 driver", true
    it_behaves_like "a SQL idempotency store"
    it_behaves_like "the transaction question"

    it "reads rows that arrive as hashes by column, in SELECT order" do
      adapter = AceMQ::AMQP::SQL.connect(db)
      expect(adapter.query("SELECT 'z' AS b, 1 AS a, NULL AS c", [])).to eq([["z", 1, nil]])
    end
  end

  RSpec.describe "SQLIdempotencyStore on a connection: callable (one connection per thread)" do
    let(:path) { sqlite_path }
    after { Thread.current[:idem_db]&.close; Thread.current[:idem_db] = nil }

    def store(**options)
      Patterns::SQLIdempotencyStore.new(connection: -> { Thread.current[:idem_db] ||= sqlite_db(path) }, **options)
                                   .tap(&:create_schema)
    end

    def stored_type(key)
      Thread.current[:idem_db].get_first_value("SELECT typeof(message_id) FROM acemq_idempotency WHERE message_id = ?", key)
    end

    it_behaves_like "a SQL idempotency store"

    it "calls the callable once per store operation, on the calling thread" do
      calls = []
      s = Patterns::SQLIdempotencyStore.new(connection: -> { calls << Thread.current; Thread.current[:idem_db] ||= sqlite_db(path) })
      s.create_schema
      calls.clear
      s.first_time?("k")
      s.confirm("k")
      Thread.new { s.confirmed?("k") }.join
      expect(calls.size).to eq(3)
      expect(calls.last).not_to eq(Thread.current)
    end
  end

  RSpec.describe "SQLIdempotencyStore on a file it opens itself (path:)" do
    let(:path) { sqlite_path }

    def store(**options)
      Patterns::SQLIdempotencyStore.new(path: path, **options).tap(&:create_schema)
    end

    def stored_type(key)
      db = sqlite_db(path)
      db.get_first_value("SELECT typeof(message_id) FROM acemq_idempotency WHERE message_id = ?", key)
    ensure
      db&.close
    end

    it_behaves_like "a SQL idempotency store"

    it "uses the table: given, and answers the schema for a migration" do
      s = store(table: "handled_keys")
      s.first_time?("k")
      expect(sqlite_db(path).get_first_value("SELECT count(*) FROM handled_keys")).to eq(1)
      expect(s.schema_sql(:postgres).first).to include("CREATE TABLE IF NOT EXISTS handled_keys", "BIGINT")
    end

    it "runs the same rules on datetime columns (times: :datetime), writing UTC as ActiveRecord does" do
      s = store(table: "handled_at", times: :datetime, claim_timeout: 0.05)
      expect(s.schema_sql(:postgres).first).to include("recorded_at TIMESTAMP(6) NOT NULL")
      expect(s.first_time?("k")).to be(true)
      expect(store(table: "handled_at", times: :datetime, worker: "other").first_time?("k")).to be(false)
      recorded, expires = sqlite_db(path).execute("SELECT recorded_at, expires_at FROM handled_at").first
      expect(recorded).to match(/\A\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\z/)
      expect(Time.parse("#{recorded} UTC")).to be_within(5).of(Time.now)
      expect(Time.parse("#{expires} UTC") - Time.parse("#{recorded} UTC")).to eq(Patterns::SQLIdempotencyStore::DEFAULT_RETENTION)
      sleep 0.1
      expect(store(table: "handled_at", times: :datetime, worker: "other", claim_timeout: 0.05).first_time?("k"))
        .to be(true)
    end

    it "refuses a kind of time column it does not know, saying which it does" do
      expect { Patterns::SQLIdempotencyStore.new(path: path, times: :iso8601) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /times: "iso8601".*:epoch_ms.*:datetime/)
    end
  end

  RSpec.describe "SQLIdempotencyStore on a PG::Connection" do
    let(:conn) { pg_connection }
    let(:table) { unique_table }
    after do
      conn.exec("DROP TABLE IF EXISTS #{table}")
      conn.exec("DROP TABLE IF EXISTS #{table}_charges")
      conn.close
    end

    def store(**options)
      Patterns::SQLIdempotencyStore.new(connection: conn, table: table, **options).tap(&:create_schema)
    end

    def stored_type(key)
      conn.exec_params("SELECT pg_typeof(message_id)::text FROM #{table} WHERE message_id = $1", [key]).getvalue(0, 0)
    end

    def transaction(&block) = conn.transaction { block.call }

    def record_charge(key)
      conn.exec("CREATE TABLE IF NOT EXISTS #{table}_charges (key TEXT NOT NULL)")
      conn.exec_params("INSERT INTO #{table}_charges (key) VALUES ($1)", [key])
    end

    def charges(key)
      conn.exec("CREATE TABLE IF NOT EXISTS #{table}_charges (key TEXT NOT NULL)")
      conn.exec_params("SELECT count(*) FROM #{table}_charges WHERE key = $1", [key]).getvalue(0, 0).to_i
    end

    it_behaves_like "a SQL idempotency store"
    it_behaves_like "the transaction question"

    it "converts columns that pg hands back as strings" do
      adapter = AceMQ::AMQP::SQL.connect(conn)
      expect(adapter.query("SELECT 1::bigint, 2::int, 2.5::float8, true, 'x'::text, NULL::text, $1::text", ["k".b]))
        .to eq([[1, 2, 2.5, 1, "x", nil, "k"]])
    end
  end

  RSpec.describe "SQLIdempotencyStore on a Mysql2::Client (MariaDB)" do
    let(:conn) { mysql_client }
    let(:table) { unique_table }
    # Before any transaction: MySQL commits the open transaction at a CREATE TABLE.
    before { conn.query("CREATE TABLE #{table}_charges (k VARCHAR(255) NOT NULL)") }
    after do
      conn.query("DROP TABLE IF EXISTS #{table}")
      conn.query("DROP TABLE IF EXISTS #{table}_charges")
      conn.close
    end

    def store(**options)
      Patterns::SQLIdempotencyStore.new(connection: conn, table: table, **options).tap(&:create_schema)
    end

    # Bytes, compared byte for byte: see the next examples.
    def key_type = "varbinary"

    def stored_type(key)
      k = conn.escape(key)
      return nil if conn.query("SELECT 1 FROM #{table} WHERE message_id = '#{k}'").count.zero?

      conn.query("SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() " \
                 "AND TABLE_NAME = '#{table}' AND COLUMN_NAME = 'message_id'").first.values.first
    end

    def transaction(&block)
      conn.query("BEGIN")
      block.call
      conn.query("COMMIT")
    rescue StandardError
      conn.query("ROLLBACK")
      raise
    end

    def record_charge(key)
      conn.query("INSERT INTO #{table}_charges (k) VALUES ('#{conn.escape(key)}')")
    end

    def charges(key)
      conn.query("SELECT count(*) AS n FROM #{table}_charges WHERE k = '#{conn.escape(key)}'").first["n"]
    end

    it_behaves_like "a SQL idempotency store"
    it_behaves_like "the transaction question"

    # MariaDB's default collation (utf8mb4_general_ci) would make these one
    # key each, and the second message would be dropped as a duplicate.
    it "keeps keys that differ only in case or trailing spaces apart" do
      s = store
      expect(%w[abc ABC].map { |k| s.first_time?(k) }).to eq([true, true])
      expect(["x", "x ", "x  "].map { |k| s.first_time?(k) }).to eq([true, true, true])
      expect(s.first_time?("x ")).to be(false)
    end

    it "quotes what a key carries: quotes, backslashes, question marks, UTF-8" do
      s = store
      keys = ["it's", "a\\b", "?", "q?'?", "caf\u00e9 \u{1F600}"]
      expect(keys.map { |k| s.first_time?(k) }).to eq([true] * keys.size)
      expect(keys.map { |k| s.first_time?(k) }).to eq([false] * keys.size)
      expect(conn.query("SELECT count(*) AS n FROM #{table}").first["n"]).to eq(keys.size)
    end

    it "refuses a connection in mysql2's default utf8 (utf8mb3), saying what to change" do
      utf8 = mysql_client(encoding: "utf8")
      expect { Patterns::SQLIdempotencyStore.new(connection: utf8, table: table) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /character set is utf8mb3.*encoding: "utf8mb4"/)
    ensure
      utf8&.close
    end

    it "refuses a key longer than the column, saying what to do" do
      expect { store.first_time?("k" * 256) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /256 bytes is longer than the 255.*SHA-256/)
      expect(store.first_time?("k" * 255)).to be(true)
    end

    [1, 10].each do |batch|
      it "dead-letters a message whose key is too long for the table at once, with batch: #{batch}, and handles the rest" do
        mq = AceMQ::AMQP::Connection.open("memory://long-keys-#{batch}")
        AceMQ::AMQP::Topology.new.queue("long").apply(mq)
        handled = Queue.new
        key = ->(m) { m.payload["long"] ? "k" * 300 : "order:#{m.payload['n']}" }
        sub = mq.consume("long", batch: batch, &Patterns.idempotent(store, key: key) do |m|
          handled << m.payload["n"]
          Ack.accept
        end)
        [{ "n" => 1 }, { "n" => 2, "long" => true }, { "n" => 3 }].each { |p| mq.publish(p, to: "long") }
        eventually { sub.stats[:accepted] == 2 && sub.stats[:dead_lettered] == 1 }
        expect(sub.stats[:retried]).to eq(0) # not a store outage: no wait, no climb
        expect(Array.new(handled.size) { handled.pop }.sort).to eq([1, 3])
        expect(mq.peek_dead_letters("long", limit: 5).map(&:reason))
          .to contain_exactly(a_string_including("300 bytes is longer than the 255"))
        sub.cancel
      ensure
        mq&.close
      end
    end

    it "gives a key to one of several threads of one worker claiming in the same millisecond" do
      s = store(worker: "one-worker")
      keys = Array.new(300) { |i| "same-ms-#{i}" }
      # A connection each (a Mysql2::Client is one thread's at a time).
      stores = Array.new(4) do
        Patterns::SQLIdempotencyStore.new(connection: AceMQ::AMQP::SQL.per_thread { mysql_client },
                                          table: table, worker: "one-worker")
      end
      s.first_time?("warm")
      go = Queue.new
      threads = stores.map { |t| Thread.new { go.pop; keys.map { |k| t.first_time?(k) } } }
      4.times { go << true }
      wins = threads.map(&:value).transpose.map { |answers| answers.count(true) }
      expect(wins).to all(eq(1))
    end
  end

  # The guide's ActiveRecord store, as written, on ActiveRecord 6.1 and
  # SQLite: the one copy of it, spec/dummy's (SeedApp loads it).
  module AR
    def self.load(path)
      SeedApp.load!
      ActiveRecord::Base.establish_connection(adapter: "sqlite3", database: path)
    end
  end

  RSpec.describe "the guide's ActiveRecordIdempotencyStore, and an ActiveRecord raw_connection" do
    let(:path) { sqlite_path }
    before { AR.load(path) }
    after { ActiveRecord::Base.remove_connection }

    it "works with Patterns.idempotent as written: one charge, retries run, confirmed rows" do
      ::CreateAcemqIdempotency.new.migrate(:up)
      store = ::ActiveRecordIdempotencyStore.new
      runs = 0
      handler = Patterns.idempotent(store) { runs += 1; runs == 1 ? Ack.retry("first try fails") : Ack.accept }

      expect(handler.call(IdempotencySQLSpec.message("ar-1"))).to be_retry
      expect(handler.call(IdempotencySQLSpec.message("ar-1"))).to be_accept
      expect(handler.call(IdempotencySQLSpec.message("ar-1"))).to be_accept
      expect(runs).to eq(2)
      expect(::HandledMessage.find("ar-1").state).to eq("CONFIRMED")
      expect(store.purge_expired).to eq(0)
    end

    it "drives our store over the raw_connection (results_as_hash) beside the migration's table" do
      raw = ActiveRecord::Base.connection.raw_connection
      expect(raw.results_as_hash).to be(true)
      ::CreateAcemqIdempotency.new.migrate(:up)
      store = Patterns::SQLIdempotencyStore.new(connection: raw, table: "acemq_idempotency_keys")
      store.create_schema

      expect(store.first_time?("k".b)).to be(true)
      expect(store.first_time?("k")).to be(false)
      store.confirm("k")
      expect(store.confirmed?("k".b)).to be(true)
      expect(raw.execute("SELECT typeof(message_id) AS t FROM acemq_idempotency_keys").first["t"]).to eq("text")
    end
  end
end
