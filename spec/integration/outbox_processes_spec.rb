# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "sqlite3"
require "pg"

module OutboxProcessesSpec
  Patterns = AceMQ::AMQP::Patterns

  # Several relay processes on one outbox table: each row goes out once while
  # nobody crashes, and a relay killed between the confirm and the delete
  # costs a duplicate, never a message.
  RSpec.describe "outbox relays in several processes" do
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
    let(:table) { outbox_table }
    after { mq.close }

    def fill(db, store, exchange, n)
      db.transaction do
        n.times { |i| store.add(Patterns.record(mq, { "n" => i }, to: "order.placed", exchange: exchange), connection: db) }
      end
    end

    def arrivals(queue, n)
      drain(queue, expect: n, timeout: 20, quiet: 0.5).map { |_, body| JSON.parse(body)["n"] }
    end

    shared_examples "relays sharing a table" do
      it "publishes every row exactly once with three relays and no crash" do
        exchange, queue = destination(mq)
        n = 300
        fill(db, store, exchange, n)
        pids = 3.times.map { |i| spawn_relay(db: db_arg, table: table, batch: 20, worker: "relay-#{i}", amqp: AMQP_URL) }
        statuses = pids.map { |pid| wait_relay(pid) }
        expect(statuses.map(&:exitstatus)).to eq([0, 0, 0])
        got = arrivals(queue, n)
        expect(got.size).to eq(n)
        expect(got.tally.select { |_, c| c > 1 }).to be_empty
        expect(got.sort).to eq((0...n).to_a)
        expect(store.backlog.count).to eq(0)
      end

      it "publishes every row exactly once with three started relays, whose deletes ride on their next claims" do
        exchange, queue = destination(mq)
        n = 300
        fill(db, store, exchange, n)
        pids = 3.times.map do |i|
          spawn_relay(db: db_arg, table: table, batch: 5, worker: "started-#{i}", amqp: AMQP_URL, mode: "start")
        end
        statuses = pids.map { |pid| wait_relay(pid) }
        expect(statuses.map(&:exitstatus)).to eq([0, 0, 0])
        got = arrivals(queue, n)
        expect(got.tally.select { |_, c| c > 1 }).to be_empty
        expect(got.sort).to eq((0...n).to_a)
        expect(store.backlog.count).to eq(0)
      end

      it "publishes again what a relay killed between confirm and delete had published: at least once, never lost" do
        exchange, queue = destination(mq)
        n = 60
        fill(db, store, exchange, n)
        killed = spawn_relay(env: { "ACEMQ_FAULT_INJECT" => "exit-after-publish" }, db: db_arg, table: table, batch: 20,
                             worker: "doomed", lease: 1, amqp: AMQP_URL)
        expect(wait_relay(killed).exitstatus).to eq(86)
        # Its 20 rows were confirmed and are still in the table, leased.
        expect(store.backlog.count).to eq(n)

        survivor = spawn_relay(db: db_arg, table: table, batch: 20, worker: "survivor", lease: 1, amqp: AMQP_URL)
        expect(wait_relay(survivor).exitstatus).to eq(0)
        got = arrivals(queue, n + 20)
        expect(got.size).to be >= n
        expect(got.uniq.sort).to eq((0...n).to_a)
        expect(got.size).to eq(n + 20) # the doomed batch, twice
        expect(store.backlog.count).to eq(0)
      end
    end

    context "on SQLite (leases under BEGIN IMMEDIATE)" do
      let(:path) { outbox_sqlite_path }
      let(:db) { outbox_sqlite(path) }
      let(:db_arg) { "sqlite:#{path}" }
      let(:store) { Patterns::SQLOutboxStore.new(connection: db, table: table).tap(&:create_schema) }

      include_examples "relays sharing a table"
    end

    context "on PostgreSQL (FOR UPDATE SKIP LOCKED)" do
      let(:db) { outbox_pg }
      let(:db_arg) { AceMQSpecHelpers::DATABASE_URL }
      let(:store) { Patterns::SQLOutboxStore.new(connection: db, table: table).tap(&:create_schema) }

      before { pg_tables_to_drop << table }
      after { db.close }

      include_examples "relays sharing a table"
    end

    context "on MariaDB (FOR UPDATE SKIP LOCKED, READ COMMITTED)" do
      let(:db) { outbox_mysql }
      let(:db_arg) { AceMQSpecHelpers::MYSQL_URL }
      let(:store) { Patterns::SQLOutboxStore.new(connection: db, table: table).tap(&:create_schema) }

      before { mysql_tables_to_drop << table }
      after { db.close }

      include_examples "relays sharing a table"
    end
  end
end
