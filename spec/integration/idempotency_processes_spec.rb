# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "sqlite3"
require "pg"

# The properties that only exist with several processes: one claim per key
# however the race goes, one charge per key however the broker redelivers,
# and a dead worker's claim taken over after claim_timeout and not before.
# Children are forked after acemq is loaded (the engine rebuilds its runtime
# in the child) and open their own connections.
module IdempotencyProcessesSpec
  Patterns = AceMQ::AMQP::Patterns

  # How a child reaches each database, and the few statements the specs need.
  class SQLiteBackend
    attr_reader :table

    def initialize(path, table)
      @path = path
      @table = table
    end

    def connect
      db = SQLite3::Database.new(@path)
      db.busy_timeout = 10_000
      db.execute("PRAGMA journal_mode = WAL")
      db.execute("PRAGMA synchronous = NORMAL")
      db
    end

    def transaction(db, &block) = db.transaction(:immediate, &block)
    def charge(db, key) = db.execute("INSERT INTO #{table}_charges (key, pid) VALUES (?, ?)", [key, Process.pid])
    def charges(db) = db.execute("SELECT key, count(*) FROM #{table}_charges GROUP BY key").to_h
    def create_charges(db) = db.execute("CREATE TABLE IF NOT EXISTS #{table}_charges (key TEXT NOT NULL, pid INTEGER)")
    def claimed_by(db, worker) = db.execute("SELECT message_id FROM #{table} WHERE state = 'CLAIMED' AND claimed_by = ?", [worker]).flatten
    def drop(_db) = nil
  end

  class PostgresBackend
    attr_reader :table

    def initialize(table)
      @table = table
    end

    def connect = PG.connect(AceMQSpecHelpers::DATABASE_URL).tap { |c| c.set_notice_processor { |_| } }
    def transaction(conn, &block) = conn.transaction { block.call }
    def charge(conn, key) = conn.exec_params("INSERT INTO #{table}_charges (key, pid) VALUES ($1, $2)", [key, Process.pid])
    def charges(conn) = conn.exec("SELECT key, count(*) FROM #{table}_charges GROUP BY key").values.to_h { |k, n| [k, n.to_i] }
    def create_charges(conn) = conn.exec("CREATE TABLE IF NOT EXISTS #{table}_charges (key TEXT NOT NULL, pid INTEGER)")

    def claimed_by(conn, worker)
      conn.exec_params("SELECT message_id FROM #{table} WHERE state = 'CLAIMED' AND claimed_by = $1", [worker]).column_values(0)
    end

    def drop(conn)
      conn.exec("DROP TABLE IF EXISTS #{table}")
      conn.exec("DROP TABLE IF EXISTS #{table}_charges")
    end
  end

  class MysqlBackend
    include IdempotencySpecHelpers
    attr_reader :table

    def initialize(table)
      @table = table
    end

    def connect = mysql_client

    def transaction(conn)
      conn.query("BEGIN")
      yield
      conn.query("COMMIT")
    rescue Exception # rubocop:disable Lint/RescueException
      conn.query("ROLLBACK")
      raise
    end

    def charge(conn, key) = conn.query("INSERT INTO #{table}_charges (k, pid) VALUES ('#{conn.escape(key)}', #{Process.pid})")
    def charges(conn) = conn.query("SELECT k, count(*) FROM #{table}_charges GROUP BY k", as: :array).to_a.to_h
    def create_charges(conn) = conn.query("CREATE TABLE IF NOT EXISTS #{table}_charges (k VARCHAR(64) NOT NULL, pid INTEGER)")

    def claimed_by(conn, worker)
      conn.query("SELECT message_id FROM #{table} WHERE state = 'CLAIMED' AND claimed_by = '#{conn.escape(worker)}'",
                 as: :array).to_a.flatten
    end

    def drop(conn)
      conn.query("DROP TABLE IF EXISTS #{table}")
      conn.query("DROP TABLE IF EXISTS #{table}_charges")
    end
  end

  RSpec.shared_examples "one winner, one charge, one takeover" do
    def store(conn, **options)
      Patterns::SQLIdempotencyStore.new(connection: conn, table: backend.table, **options)
    end

    before do
      @conn = backend.connect
      store(@conn).create_schema
      backend.create_charges(@conn)
    end

    after do
      backend.drop(@conn)
      @conn.close
    end

    it "(a) two processes racing first_time? on one key: exactly one winner every round" do
      rounds = 150
      wins = race_first_time(rounds) { store(backend.connect) }
      expect(wins.size).to eq(rounds)
      expect(wins.values.uniq).to eq([1])
    end

    it "(b) three consumers on one queue, every message delivered twice and one consumer killed: one charge per key" do
      n = 40
      queue = unique("idem-procs")
      mq = AceMQ::AMQP::Connection.open(AMQP_URL)
      AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
      workers = Array.new(3) do |i|
        worker = "consumer-#{i}-#{SecureRandom.hex(3)}"
        pid, io = spawn_child do |out|
          conn = backend.connect
          s = store(conn, worker: worker, claim_timeout: 2)
          child_mq = AceMQ::AMQP::Connection.open(AMQP_URL)
          # The guide's transaction: the charge and the confirmed key commit
          # together, so a kill between them leaves neither.
          # A redelivery that finds a live claim (the killed consumer's) is
          # retried, and the ladder outlasts claim_timeout, so it runs once
          # the claim is stale.
          child_mq.consume(queue, prefetch: 4, retries: { max_attempts: 10, initial_delay: 0.5, max_delay: 1 },
                                  &Patterns.idempotent(s) do |m|
            sleep 0.02 # the call to the payment gateway: where a kill lands
            backend.transaction(conn) do
              backend.charge(conn, m.envelope.id)
              s.confirm(m.envelope.id)
            end
            AceMQ::AMQP::Ack.accept
          end)
          out.puts "ready"
          sleep
        end
        expect(read_line(io)).to eq("ready")
        [pid, worker]
      end

      envelopes = Array.new(n) { AceMQ::AMQP::Envelope.new(type: "payment.requested.v1") }
      envelopes.each { |e| 2.times { mq.publish({ "n" => 1 }, to: queue, envelope: e) } }
      eventually(timeout: 15) { backend.charges(@conn).size >= n / 4 }
      killed_pid, = workers.first
      Process.kill(:KILL, killed_pid)
      wait_child(killed_pid)

      # A message the dead consumer held mid-handler left a live CLAIMED row
      # and no charge. Its redelivery is not accepted as a duplicate: it
      # climbs the retry ladder until the claim is stale, then runs, once.
      eventually(timeout: 20) { backend.charges(@conn).size == n }
      expect(backend.charges(@conn).keys).to match_array(envelopes.map(&:id))
      expect(backend.charges(@conn).values.uniq).to eq([1])
    ensure
      mq&.close
    end

    it "(c) a claim left by a process killed mid-handler is taken over after claim_timeout, and not before" do
      key = unique("kill")
      pid, io = spawn_child do |out|
        s = store(backend.connect, worker: "doomed", claim_timeout: 2)
        Patterns.idempotent(s) { out.puts("in handler"); sleep }
                .call(AceMQ::AMQP::Message.new(payload: {}, envelope: AceMQ::AMQP::Envelope.new(id: key)))
      end
      expect(read_line(io)).to eq("in handler")
      Process.kill(:KILL, pid)
      killed_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      wait_child(pid)

      survivor = store(@conn, worker: "survivor", claim_timeout: 2)
      taken_at = nil
      Timeout.timeout(5) do
        until survivor.first_time?(key)
          sleep 0.05
        end
        taken_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end
      expect(taken_at - killed_at).to be_between(1.7, 3.0)
      expect(survivor.first_time?(key)).to be(false)
    end

    it "(d) a store built before a fork claims as the child in the child: it cannot forget the parent's claim" do
      conns = {}
      shared = store(-> { conns[Process.pid] ||= backend.connect }) # no worker: hostname:pid, read at each call
      parent_key = unique("parent")
      child_key = unique("child")
      expect(shared.first_time?(parent_key)).to be(true)
      parent_worker = shared.worker
      pid, io = spawn_child do |out|
        out.puts(shared.worker)
        shared.forget(parent_key) # not this worker's claim: must stay
        out.puts(shared.first_time?(child_key))
      end
      child_worker = read_line(io)
      expect(read_line(io)).to eq("true")
      wait_child(pid)
      expect(parent_worker).to end_with(":#{Process.pid}")
      expect(child_worker).to end_with(":#{pid}")
      expect(backend.claimed_by(@conn, parent_worker)).to eq([parent_key])
      expect(backend.claimed_by(@conn, child_worker)).to eq([child_key])
      conns.each_value(&:close)
    end
  end

  RSpec.describe "the SQL idempotency store across processes, SQLite (WAL)" do
    let(:backend) { SQLiteBackend.new(sqlite_path, unique_table) }
    it_behaves_like "one winner, one charge, one takeover"
  end

  RSpec.describe "the SQL idempotency store across processes, PostgreSQL" do
    let(:backend) { PostgresBackend.new(unique_table) }
    it_behaves_like "one winner, one charge, one takeover"
  end

  RSpec.describe "the SQL idempotency store across processes, MariaDB (mysql2)" do
    let(:backend) { MysqlBackend.new(unique_table) }
    it_behaves_like "one winner, one charge, one takeover"
  end

  RSpec.describe "the SQL idempotency store across processes, SQLite file opened by the library (path:)" do
    it "(a) two processes racing first_time?: exactly one winner every round" do
      path = sqlite_path
      Patterns::SQLIdempotencyStore.new(path: path).create_schema
      wins = race_first_time(150) { Patterns::SQLIdempotencyStore.new(path: path) }
      expect(wins.values).to eq([1] * 150)
    end
  end
end
