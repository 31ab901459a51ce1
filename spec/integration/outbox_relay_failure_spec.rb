# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"

# A started relay whose database fails in the middle of a backlog: it says
# so once an interval, like core's Rust relay, rather than retrying at once
# in a loop, and once the database is back every row goes out once.
module OutboxRelayFailureSpec
  Patterns = AceMQ::AMQP::Patterns

  RSpec.describe "a started outbox relay whose database fails mid-backlog" do
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
    let(:db) { outbox_sqlite(outbox_sqlite_path) }
    after do
      mq.close
      db.close
    end

    it "waits out its interval between failed sweeps and loses nothing" do
      exchange, queue = destination(mq)
      setup = Patterns::SQLOutboxStore.new(connection: db, table: outbox_table("fail"))
      setup.create_schema
      db.transaction do
        6.times { |n| setup.add(Patterns.record(mq, { "n" => n }, to: "order.placed", exchange: exchange), connection: db) }
      end
      # The store asks the callable for its connection once per operation:
      # the first two (two claims, the first batch in flight meanwhile) get
      # it, then the database is gone, with the first batch's delete held
      # and the second batch in flight.
      calls = 0
      broken = true
      source = lambda do
        calls += 1
        raise IOError, "the database is unreachable" if broken && calls > 2

        db
      end
      store = Patterns::SQLOutboxStore.new(connection: source, table: setup.table)
      errors = Queue.new
      relay = Patterns::OutboxRelay.new(mq, store, batch_size: 3, interval: 0.2, on_error: lambda { |error, **|
        errors << [error, Process.clock_gettime(Process::CLOCK_MONOTONIC)]
      })
      begin
        relay.start
        eventually { errors.size >= 3 }
        (first, at), (_, second), (_, third) = Array.new(3) { errors.pop }
        expect(first.message).to include("the database is unreachable")
        # An interval apart (less a margin for the clock), not back to back.
        expect([second - at, third - second]).to all(be > 0.15)
        broken = false
        eventually(timeout: 10) { mq.queue_counts(queue)[:ready] == 6 }
      ensure
        relay.close
      end
      expect(drain(queue, expect: 6).map { |_, body| JSON.parse(body)["n"] }).to eq((0...6).to_a)
      expect(setup.backlog.count).to eq(0)
    end
  end

  # The store's own reads from another thread while its relay sweeps, on a
  # PG::Connection: ruby-pg waits on the server without the GVL, and two
  # threads inside libpq on one connection crashed the process (seen while
  # writing the outbox specs). The adapter takes one statement at a time.
  RSpec.describe "a started outbox relay's store read from another thread on PostgreSQL" do
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
    let(:db) { outbox_pg }
    let(:table) { outbox_table("shared") }
    before { pg_tables_to_drop << table }
    after do
      mq.close
      db.close
    end

    it "answers backlog while the relay drains, and loses nothing" do
      exchange, queue = destination(mq)
      store = Patterns::SQLOutboxStore.new(connection: db, table: table)
      store.create_schema
      db.transaction do
        600.times { |n| store.add(Patterns.record(mq, { "n" => n }, to: "order.placed", exchange: exchange), connection: db) }
      end
      relay = Patterns::OutboxRelay.new(mq, store, batch_size: 50, interval: 60, listen: false)
      counts = []
      begin
        relay.start
        eventually(timeout: 20, interval: 0) { (counts << store.backlog.count).last.zero? }
      ensure
        relay.close
      end
      expect(counts.size).to be > 1
      expect(counts).to eq(counts.sort.reverse)
      expect(drain(queue, expect: 600).size).to eq(600)
    end
  end
end
