# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "sqlite3"
begin
  require "pg" # for its version in a description; its examples skip without DATABASE_URL
rescue LoadError
  nil
end

# Where a SQL store gets its connection on the threads a consumer starts:
# the tutorial's -> { Thread.current[:db] } (nil there, and now an error that
# says what to write), SQL.per_thread (one connection per thread, opened
# when first needed), and an ActiveRecord connection pool (a connection lent
# per statement, one held for a transaction the engine runs). Real
# consumers on memory:// and on RabbitMQ, real SQLite files and PostgreSQL.
module SQLConnectionSourcesSpec
  Patterns = AceMQ::AMQP::Patterns
  SQL = AceMQ::AMQP::SQL
  Ack = AceMQ::AMQP::Ack

  def self.message(id)
    AceMQ::AMQP::Message.new(payload: { "order_id" => id }, envelope: AceMQ::AMQP::Envelope.new(id: id))
  end

  def self.postgres_skip = ActiveRecordSpecHelpers.postgres? ? false : "DATABASE_URL is not set"

  # Holds the first `n` handlers until all n are running at once, so that a
  # spec with concurrency n knows every consumer thread took part.
  class Rendezvous
    def initialize(n)
      @n = n
      @arrived = 0
      @lock = Mutex.new
      @all_here = ConditionVariable.new
    end

    def wait(timeout: 10)
      @lock.synchronize do
        return if @arrived >= @n

        @arrived += 1
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        @all_here.broadcast if @arrived == @n
        while @arrived < @n
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          raise "only #{@arrived} of #{@n} handlers ran at once" if left <= 0

          @all_here.wait(@lock, left)
        end
      end
    end
  end

  # A consumer with `concurrency` threads over a guarded handler: every
  # message published twice (a redelivery, as the handler sees it), each
  # charged once, and every consumer thread used the store.
  RSpec.shared_examples "a store on every consumer thread" do |concurrency: 4, messages: 12, batch: 1|
    it "charges each of #{messages} messages once, with #{concurrency} consumer threads" do
      queue = unique("sources")
      AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
      rendezvous = Rendezvous.new(concurrency)
      charged = Queue.new
      threads = Queue.new
      guarded = Patterns.idempotent(store) do |m|
        threads << Thread.current
        rendezvous.wait
        charged << m.envelope.id
        Ack.accept
      end
      envelopes = Array.new(messages) { AceMQ::AMQP::Envelope.new }
      sub = mq.consume(queue, concurrency: concurrency, prefetch: 2 * messages, batch: batch, &guarded)
      envelopes.each { |e| 2.times { mq.publish({ "n" => 1 }, to: queue, envelope: e) } }

      eventually(timeout: 20) { sub.stats[:accepted] + sub.stats[:retried] >= 2 * messages && charged.size == messages }
      eventually(timeout: 20) { envelopes.all? { |e| store.confirmed?(e.id) } }
      ids = Array.new(charged.size) { charged.pop }
      expect(ids.sort).to eq(envelopes.map(&:id).sort)
      expect(Array.new(threads.size) { threads.pop }.uniq.size).to eq(concurrency)
      expect(sub.stats[:dead_lettered]).to eq(0)
      # On SQLite through ActiveRecord the sqlite3 gem waits for the file's
      # lock holding the GVL, so the thread that holds the lock may not run
      # until the wait gives up: a store error now and then (1 of 4 threads
      # once in a full CI run under load). The message is then retried, and
      # the checks above (each charged once, none dead-lettered) still hold.
      expect(guarded.stats[:store_errors]).to eq(0) unless respond_to?(:sqlite?) && sqlite?
      after_consuming if respond_to?(:after_consuming) # while the consumer threads are alive
      sub.cancel
    end
  end

  RSpec.describe "connection: -> { Thread.current[:db] } on a thread that never set it" do
    let(:path) { sqlite_path }

    it "fails with an error that says exactly what to write" do
      Thread.current[:db] = SQLite3::Database.new(path)
      store = Patterns::SQLIdempotencyStore.new(connection: -> { Thread.current[:db] })
      store.create_schema
      expect(store.first_time?("here")).to be(true)

      error = Thread.new do
        Thread.current.name = "acemq payments 1"
        store.first_time?("there")
      rescue AceMQ::AMQP::StoreError => e
        e
      end.value
      expect(error).to be_a(AceMQ::AMQP::StoreError)
      expect(error.message).to include('returned nil on thread "acemq payments 1"')
      expect(error.message).to include("a consumer's handler runs on threads the subscription starts")
      expect(error.message).to include('AceMQ::AMQP::SQL.per_thread { SQLite3::Database.new("payments.db") }')
      expect(error.message).to include('-> { Thread.current[:db] ||= SQLite3::Database.new("payments.db") }')
    ensure
      Thread.current[:db]&.close
      Thread.current[:db] = nil
    end

    it "works in the form the error gives: -> { Thread.current[:db] ||= … }, on a consumer's threads" do
      mq = AceMQ::AMQP::Connection.open(memory_url)
      queue = unique("tls")
      AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
      db_path = path
      opened = Queue.new
      open = lambda do
        db = SQLite3::Database.new(db_path)
        db.busy_timeout = 10_000
        opened << db
        db
      end
      # A key of our own per thread: Thread.current[] is the fiber's, and
      # another spec's :db must not leak into this one.
      key = :"db_#{SecureRandom.hex(4)}"
      store = Patterns::SQLIdempotencyStore.new(connection: -> { Thread.current[key] ||= open.call })
      store.create_schema
      charged = Queue.new
      sub = mq.consume(queue, concurrency: 3, &Patterns.idempotent(store) { |m| charged << m.envelope.id; Ack.accept })
      envelope = AceMQ::AMQP::Envelope.new
      2.times { mq.publish({}, to: queue, envelope: envelope) }

      eventually { sub.stats[:accepted] == 2 }
      expect(charged.size).to eq(1)
      expect(opened.size).to be_between(2, 4) # this thread's, and one per consumer thread that took a message
    ensure
      sub&.cancel
      mq&.close
      Array.new(opened&.size.to_i) { opened.pop.close }
    end
  end

  RSpec.describe "SQL.per_thread" do
    let(:path) { sqlite_path }
    let(:source) do
      db_path = path
      SQL.per_thread do
        db = SQLite3::Database.new(db_path)
        db.busy_timeout = 10_000
        db.execute("PRAGMA journal_mode = WAL")
        db
      end
    end
    let(:store) { Patterns::SQLIdempotencyStore.new(connection: source) }

    before { store.create_schema }
    after { source.close }

    it "opens one connection per thread, when first needed, and reuses it" do
      expect(source.size).to eq(1) # create_schema's, on this thread
      mine = source.checkout
      expect(source.checkout).to be(mine)
      theirs = Array.new(3) { Thread.new { [source.checkout, source.checkout] } }.map(&:value)
      expect(theirs.map { |a, b| a.equal?(b) }).to eq([true, true, true])
      expect(theirs.map(&:first).uniq.size).to eq(3)
      expect(theirs.map(&:first)).not_to include(mine)
    end

    it "closes a connection whose thread has ended when the next one is opened" do
      dead = Thread.new { source.checkout }.tap(&:join).value
      db = dead.instance_variable_get(:@db)
      Thread.new { source.checkout }.join
      expect(db).to be_closed
    end

    it "opens a new connection in a forked child instead of using the parent's" do
      parent = source.checkout.instance_variable_get(:@db)
      src = source
      pid, out = spawn_child do |o|
        child = src.checkout.instance_variable_get(:@db)
        o.puts(child.equal?(parent) ? "inherited" : "own")
        st = Patterns::SQLIdempotencyStore.new(connection: src)
        o.puts(st.first_time?("from-child"))
        # Confirmed, as a handler does: an exited child's bare claim would be
        # a dead worker's, taken over by the next to ask.
        st.confirm("from-child")
      end
      expect(read_line(out)).to eq("own")
      expect(read_line(out)).to eq("true")
      expect(wait_child(pid)).to be_success
      expect(store.first_time?("from-child")).to be(false)
      expect(parent).not_to be_closed
    end

    it "refuses a block that returns no connection, and SQL.per_thread without a block" do
      broken = Patterns::SQLIdempotencyStore.new(connection: SQL.per_thread { nil })
      expect { broken.first_time?("k") }.to raise_error(AceMQ::AMQP::StoreError, /per_thread block returned nil/)
      expect { SQL.per_thread }.to raise_error(AceMQ::AMQP::ConfigurationError, /needs a block/)
    end

    context "with a consumer on memory://" do
      let(:mq) { AceMQ::AMQP::Connection.open(memory_url) }

      after { mq.close }

      def after_consuming = expect(source.size).to be >= 5 # this thread's and the four consumer threads'

      it_behaves_like "a store on every consumer thread"
    end

    context "with a consumer on RabbitMQ" do
      let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }

      after { mq.close }

      def after_consuming = expect(source.size).to be >= 5

      it_behaves_like "a store on every consumer thread"
    end
  end

  RSpec.describe "SQL.per_thread on PostgreSQL, batches on RabbitMQ", skip: postgres_skip do
    let(:table) { unique_table("per_thread") }
    let(:source) { SQL.per_thread { pg_connection } }
    let(:store) { Patterns::SQLIdempotencyStore.new(connection: source, table: table) }
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }

    before { store.create_schema }

    after do
      mq.close
      source.close
      drop_pg_tables(table)
    end

    # batch: claims each batch in one statement and confirms it in another,
    # on the thread's own connection.
    it_behaves_like "a store on every consumer thread", concurrency: 3, messages: 30, batch: 10
  end

  # An ActiveRecord connection pool as the source, on both databases.
  RSpec.shared_examples "an ActiveRecord connection pool as the source" do
    let(:pool) { ActiveRecord::Base.connection_pool }
    let(:table) { "acemq_idempotency_keys" } # beside the guide's table, which has datetime columns
    let(:store) { Patterns::SQLIdempotencyStore.new(connection: pool, table: table) }

    before do
      store.create_schema
      pool.release_connection
    end

    def busy = pool.connections.count(&:in_use?)

    # A trigger that fails the claim of one key, so a batch fails half way.
    def fail_claims_of(key)
      c = ActiveRecord::Base.connection
      if sqlite?
        c.execute("CREATE TRIGGER boom BEFORE INSERT ON #{table} WHEN NEW.message_id = '#{key}' " \
                  "BEGIN SELECT RAISE(ABORT, 'boom'); END")
      else
        c.execute("CREATE FUNCTION boom() RETURNS trigger AS $$ BEGIN IF NEW.message_id = '#{key}' THEN " \
                  "RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql")
        c.execute("CREATE TRIGGER boom BEFORE INSERT ON #{table} FOR EACH ROW EXECUTE FUNCTION boom()")
      end
      pool.release_connection
    end

    it "lends a connection per operation and takes it back" do
      expect(store.first_time?("k")).to be(true)
      store.confirm("k")
      expect(store.confirmed?("k")).to be(true)
      expect(busy).to eq(0)
    end

    it "uses the thread's own connection when it holds one, and with it the thread's transaction" do
      ActiveRecord::Base.transaction do
        expect(store.first_time?("in-tx")).to be(true)
        raise ActiveRecord::Rollback
      end
      expect(store.first_time?("in-tx")).to be(true) # the claim rolled back with the transaction
    end

    it "claims a batch in one statement: a claim failing for one key claims none of them" do
      fail_claims_of("boom")
      guarded = Patterns.idempotent(store) { Ack.accept }

      results = guarded.call_many([SQLConnectionSourcesSpec.message("a"), SQLConnectionSourcesSpec.message("boom")])
      expect(results.map { |r| r.kind.to_s }).to eq(%w[wait wait])
      expect(results[0].reason).to match(/idempotency store failed.*boom/m)
      expect(busy).to eq(0)
      expect(store.first_time?("a")).to be(true) # "a" was in the statement that failed
      store.forget("a")

      results = guarded.call_many(%w[a b a].map { |k| SQLConnectionSourcesSpec.message(k) })
      expect(results.map { |r| r.kind.to_s }).to eq(%w[accept accept wait]) # the same key again: it waits
      expect(%w[a b].map { |k| store.confirmed?(k) }).to eq([true, true])
      expect(busy).to eq(0)
    end

    it "claims a batch inside the thread's transaction, like first_time?: a batch claim has no transaction of its own" do
      guarded = Patterns.idempotent(store) { Ack.accept }
      ActiveRecord::Base.transaction do
        results = guarded.call_many([SQLConnectionSourcesSpec.message("x"), SQLConnectionSourcesSpec.message("y")])
        expect(results.map { |r| r.kind.to_s }).to eq(%w[accept accept])
        expect(ActiveRecord::Base.connection.transaction_open?).to be(true)
        raise ActiveRecord::Rollback
      end
      pool.release_connection
      expect(busy).to eq(0)
      expect(%w[x y].map { |k| store.first_time?(k) }).to eq([true, true]) # rolled back with the transaction
    end

    it "refuses a transaction of its own (an outbox relay's claim) on a thread whose connection is inside one" do
      lease = SQL.connect(pool).checkout
      ActiveRecord::Base.transaction do
        ActiveRecord::Base.connection.execute("SELECT 1")
        expect { lease.execute(sqlite? ? "BEGIN IMMEDIATE" : "BEGIN", []) }
          .to raise_error(AceMQ::AMQP::StoreError, /inside one: call it outside ActiveRecord::Base.transaction/)
        expect(ActiveRecord::Base.connection.transaction_open?).to be(true)
        raise ActiveRecord::Rollback
      end
      pool.release_connection # the transaction's own
      expect(busy).to eq(0)
    end

    it "takes ActiveRecord::Base.connection as well: its raw connection, asked for at each operation" do
      on_adapter = Patterns::SQLIdempotencyStore.new(connection: ActiveRecord::Base.connection, table: table)
      expect(on_adapter.first_time?("adapter".b)).to be(true)
      expect(store.first_time?("adapter")).to be(false)
    end

    context "with a consumer on memory://" do
      let(:mq) { AceMQ::AMQP::Connection.open(memory_url) }

      after { mq.close }

      def after_consuming = expect(busy).to eq(0)

      it_behaves_like "a store on every consumer thread"
    end

    context "with a consumer on RabbitMQ, in batches" do
      let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }

      after { mq.close }

      def after_consuming = expect(busy).to eq(0)

      it_behaves_like "a store on every consumer thread", concurrency: 3, messages: 30, batch: 10
    end
  end

  RSpec.describe "connection: ActiveRecord::Base.connection_pool on SQLite" do
    before { establish_active_record(:sqlite) }

    def sqlite? = true

    it_behaves_like "an ActiveRecord connection pool as the source"
  end

  RSpec.describe "connection: ActiveRecord::Base.connection_pool on PostgreSQL", skip: postgres_skip do
    before { establish_active_record(:postgres) }

    def sqlite? = false

    it_behaves_like "an ActiveRecord connection pool as the source"
  end
end

# The drivers as installed, each handed to both stores as it is: what
# sqlite3 2.x changed (Database.new(results_as_hash:, strict:), frozen
# results, binds only as an Array, writable connections closed in a forked
# child) and pg 1.7 beside Debian 12's sqlite3 1.4 and pg 1.4. The driver
# versions are in the descriptions, so a run's output says which it was.
module SQLConnectionSourcesSpec
  RSpec.shared_examples "both stores on the driver's own connection" do
    let(:mq) { AceMQ::AMQP::Connection.open(memory_url) }
    let(:tables) { [unique_table("keys"), unique_table("outbox")] }
    let(:idempotency) { Patterns::SQLIdempotencyStore.new(connection: db, table: tables[0]) }
    let(:outbox) { Patterns::SQLOutboxStore.new(connection: db, table: tables[1]) }

    after { mq.close }

    it "claims, confirms and forgets a key, binary (a delivery's) and UTF-8 (a console's) alike" do
      idempotency.create_schema
      expect(idempotency.first_time?("m-1".b)).to be(true)
      expect(idempotency.first_time?("m-1")).to be(false)
      idempotency.confirm("m-1")
      expect(idempotency.confirmed?("m-1".b)).to be(true)
      expect(idempotency.first_time?("m-2")).to be(true)
      idempotency.forget("m-2".b)
      expect(idempotency.first_time?("m-2")).to be(true)
    end

    it "adds in the caller's transaction and the relay publishes the committed rows, non-ASCII intact" do
      outbox.create_schema
      AceMQ::AMQP::Topology.new.queue("orders").apply(mq)
      record = -> { Patterns.record(mq, { "customer" => "Zoë" }, to: "orders", type: "order.placed.v1") }

      in_transaction(db, commit: false) { outbox.add(record.call, connection: db) }
      in_transaction(db, commit: true) { outbox.add(record.call, connection: db) }

      expect(outbox.backlog.count).to eq(1)
      expect(Patterns::OutboxRelay.new(mq, outbox).sweep).to eq(1)
      expect(mq.queue_depth("orders")).to eq(ready: 1, unacked: 0)
      expect(outbox.backlog.count).to eq(0)
      received = Queue.new
      sub = mq.consume("orders") { |m| received << [m.payload, m.type]; Ack.accept }
      eventually { !received.empty? }
      expect(received.pop).to eq([{ "customer" => "Zoë" }, "order.placed.v1"])
    ensure
      sub&.cancel
    end
  end

  RSpec.describe "both stores on a SQLite3::Database (sqlite3 #{SQLite3::VERSION}, SQLite #{SQLite3::SQLITE_VERSION})" do
    # The driver's own transaction, as the tutorial's db.transaction.
    def in_transaction(db, commit:)
      db.transaction
      yield
      commit ? db.commit : db.rollback
    end

    context "opened as sqlite3 2.x has it: Database.new(path, results_as_hash: true, strict: true)" do
      # results_as_hash as an option is honoured by 1.4 too; strict (no
      # double-quoted string literals in any store's SQL) is 2.x's and
      # ignored by 1.4.
      let(:db) { SQLite3::Database.new(sqlite_path, results_as_hash: true, strict: true) }

      after { db.close }

      it "hands rows back as hashes" do
        expect(db.results_as_hash).to be(true)
        expect(db.execute("SELECT 1 AS one")).to eq([{ "one" => 1 }])
      end

      it_behaves_like "both stores on the driver's own connection"
    end

    context "opened plainly (rows as arrays)" do
      let(:db) { SQLite3::Database.new(sqlite_path) }

      after { db.close }

      it_behaves_like "both stores on the driver's own connection"
    end

    it "says the connection is closed, in an error of its own, rather than the driver's prepare error" do
      db = SQLite3::Database.new(sqlite_path)
      store = Patterns::SQLIdempotencyStore.new(connection: db)
      store.create_schema
      db.close

      expect { store.first_time?("k") }
        .to raise_error(AceMQ::AMQP::StoreError, /raised AceMQ::AMQP::SQL::ClosedConnection: the SQLite3::Database is closed/)
      expect(AceMQ::AMQP::SQL::ClosedConnection.ancestors).to include(AceMQ::AMQP::StoreError)
    end

    it "in a forked child: sqlite3 2.x has closed the parent's connection, and the store says so" do
      skip "sqlite3 #{SQLite3::VERSION} leaves a parent's connection open in a child" unless defined?(SQLite3::ForkSafety)

      db = SQLite3::Database.new(sqlite_path)
      store = Patterns::SQLIdempotencyStore.new(connection: db)
      store.create_schema
      SQLite3::ForkSafety.suppress_warnings! # its warning is this example's subject, not noise in the run
      pid, out = spawn_child do |o|
        store.first_time?("from-child")
        o.puts("claimed")
      rescue AceMQ::AMQP::StoreError => e
        o.puts(e.message[/ClosedConnection: [^(]*\(([^)]*)\)/, 1])
      end

      expect(read_line(out)).to eq("sqlite3 2.x closes the writable connections a forked child inherits")
      expect(wait_child(pid)).to be_success
      expect(store.first_time?("k")).to be(true) # the parent's is still its own
    ensure
      db&.close
    end
  end

  RSpec.describe "both stores on a PG::Connection (pg #{defined?(PG::VERSION) ? PG::VERSION : '(not loaded)'})",
                 skip: postgres_skip do
    let(:db) { pg_connection }

    after do
      drop_pg_tables(*tables)
      db.close
    end

    def in_transaction(db, commit:)
      db.exec("BEGIN")
      yield
      db.exec(commit ? "COMMIT" : "ROLLBACK")
    end

    it_behaves_like "both stores on the driver's own connection"
  end
end
