# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "sqlite3"
require "pg"

# The transactional outbox against RabbitMQ, SQLite files and PostgreSQL:
# the guide's Tutorial 3 Steps 5 and 6 as written, and what the relay does
# with a destination that keeps failing.
module OutboxSpec
  Patterns = AceMQ::AMQP::Patterns
  Ack = AceMQ::AMQP::Ack

  # The including group defines `db` (the application's connection) and
  # `store` (a SQLOutboxStore on the table `table`).
  RSpec.shared_examples "an outbox in the caller's transaction" do
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
    let(:orders_table) { outbox_table("orders") }
    # Made before any transaction: a table created inside one would roll back with it.
    let!(:orders) { OutboxSpecHelpers::Orders.new(db, orders_table) }

    before do
      pg_tables_to_drop << orders_table
      mysql_tables_to_drop << orders_table
      store.create_schema
    end
    after { mq.close }

    it "keeps a committed row and loses a rolled-back one, with the work" do
      record = -> { Patterns.record(mq, { "order_id" => "A-1" }, to: "order.placed", exchange: "orders-events") }
      expect do
        db.transaction do
          orders.insert("id" => "A-1", "total" => 42)
          store.add(record.call, connection: db)
          raise ArgumentError, "the business write failed"
        end
      end.to raise_error(ArgumentError)
      expect(store.backlog.count).to eq(0)
      expect(orders.count).to eq(0)

      db.transaction do
        orders.insert("id" => "A-2", "total" => 42)
        store.add(record.call, connection: db)
      end
      expect(store.backlog).to have_attributes(count: 1, stuck: 0)
      expect(orders.count).to eq(1)
    end

    it "runs Tutorial 3 Step 5 as written" do
      exchange, queue = destination(mq, exchange: unique("orders-events"))
      order = { "id" => "A-7", "total" => 4200 }
      event = { "order_id" => "A-7", "total" => 4200 }

      db.transaction do
        orders.insert(order)
        store.add(Patterns.record(mq, event, to: "order.placed", exchange: exchange,
                                             type: "order.placed.v2"),
                  connection: db)
      end

      relay = Patterns::OutboxRelay.new(mq, store, interval: 1)
      expect(relay.sweep).to eq(1)
      (props, body), = drain(queue, expect: 1)
      expect(JSON.parse(body)).to eq(event)
      expect(props[:type]).to eq("order.placed.v2")
      expect(store.backlog).to have_attributes(count: 0)
      expect(relay.sweep).to eq(0)
    end

    it "sends what a direct publish sends, property for property and header for header" do
      exchange, queue = destination(mq)
      headers = { "tenant" => "acme", "n" => 7, "ok" => true, "tags" => %w[a b] }
      record = Patterns.record(mq, { "order_id" => "A-9" }, to: "order.placed", exchange: exchange,
                                                             type: "order.placed.v2", headers: headers)
      db.transaction { store.add(record, connection: db) }
      Patterns::OutboxRelay.new(mq, store).sweep
      relayed_props, relayed_body = drain(queue, expect: 1).first

      # The same envelope published directly: every property and header must
      # be the same bytes, ids and timestamp included.
      mq.publish({ "order_id" => "A-9" }, to: "order.placed", exchange: exchange, envelope: record.envelope)
      direct_props, direct_body = drain(queue, expect: 1).first
      expect(relayed_body).to eq(direct_body)
      expect(relayed_props.to_h).to eq(direct_props.to_h)
      %i[content_type delivery_mode message_id type app_id timestamp].each do |p|
        expect(relayed_props[p]).not_to be_nil, "#{p} missing"
      end
      expect(relayed_props[:headers]).to eq(direct_props[:headers])
      expect(relayed_props[:headers]).to include(headers)

      # And a fresh direct publish with the same arguments differs only in
      # its id and timestamp: the outbox is not a different kind of message.
      fresh = mq.publish({ "order_id" => "A-9" }, to: "order.placed", exchange: exchange, type: "order.placed.v2",
                                                  headers: headers)
      fresh_props, fresh_body = drain(queue, expect: 1).first
      expect(fresh_body).to eq(relayed_body)
      strip = lambda do |props|
        h = props.to_h.reject { |k, _| %i[message_id timestamp].include?(k) }
        h.merge(headers: h[:headers].reject { |k, _| k == "x-acemq-id" })
      end
      expect(strip.call(relayed_props)).to eq(strip.call(fresh_props))
      expect(fresh_props[:message_id]).to eq(fresh.id)
    end

    it "retries a row whose exchange does not exist with a backoff, without holding back rows behind it" do
      exchange, queue = destination(mq)
      missing = unique("no-such-exchange")
      errors = []
      relay = Patterns::OutboxRelay.new(mq, store, on_error: lambda { |error, exchange:, routing_key:|
        errors << [error.class, exchange, routing_key]
      })
      db.transaction do
        store.add(Patterns.record(mq, { "n" => 0 }, to: "order.placed", exchange: missing), connection: db)
        3.times { |i| store.add(Patterns.record(mq, { "n" => i + 1 }, to: "order.placed", exchange: exchange), connection: db) }
      end

      expect(relay.sweep).to eq(3)
      expect(drain(queue, expect: 3).map { |_, body| JSON.parse(body)["n"] }).to eq([1, 2, 3])
      expect(errors).to eq([[AceMQ::AMQP::NotFound, missing, "order.placed"]])
      stuck = store.stuck
      expect(stuck.size).to eq(1)
      expect(stuck.first).to have_attributes(exchange: missing, routing_key: "order.placed", attempts: 1)
      expect(stuck.first.last_error).to match(/NOT_FOUND|no exchange/i)
      expect(stuck.first.next_attempt_at).to be > Time.now
      expect(store.backlog).to have_attributes(count: 1, stuck: 1)

      # Backing off: not due again at once, so a sweep now publishes nothing
      # and reports nothing.
      expect(relay.sweep).to eq(0)
      expect(errors.size).to eq(1)
    end

    # A started relay claims its next batch while a full batch's confirms
    # are out (docs/outbox.md, "Draining a backlog"): the rows still leave in
    # id order, a failing row among them is backed off alone, and a relay
    # that stops leaves nothing leased or undeleted.
    it "drains a backlog of full batches through relay.start in id order, a failing row among them" do
      exchange, queue = destination(mq)
      missing = unique("no-such-exchange")
      errors = []
      db.transaction do
        10.times do |n|
          store.add(Patterns.record(mq, { "n" => n }, to: "order.placed", exchange: n == 4 ? missing : exchange),
                    connection: db)
        end
      end
      relay = Patterns::OutboxRelay.new(mq, store, batch_size: 3, interval: 60, listen: false,
                                                   on_error: ->(error, exchange:, routing_key:) { errors << [error.class, exchange] })
      begin
        relay.start
        # Watched on the broker: the store's connection is the relay thread's
        # while it runs (a driver connection is not for two threads at once).
        eventually(timeout: 10) { mq.queue_counts(queue)[:ready] == 9 }
      ensure
        relay.close
      end

      expect(drain(queue, expect: 9).map { |_, body| JSON.parse(body)["n"] }).to eq([0, 1, 2, 3, 5, 6, 7, 8, 9])
      expect(errors).to eq([[AceMQ::AMQP::NotFound, missing]])
      expect(store.stuck.map { |row| [row.exchange, row.attempts] }).to eq([[missing, 1]])
      expect(store.backlog).to have_attributes(count: 1, stuck: 1)
    end

    it "leaves nothing leased when relay.close stops it in the middle of a backlog" do
      exchange, queue = destination(mq)
      db.transaction do
        300.times { |n| store.add(Patterns.record(mq, { "n" => n }, to: "order.placed", exchange: exchange), connection: db) }
      end
      relay = Patterns::OutboxRelay.new(mq, store, batch_size: 3, interval: 60, listen: false)
      begin
        relay.start
        eventually(timeout: 10) { mq.queue_counts(queue)[:ready] >= 30 }
      ensure
        relay.close
      end
      expect(mq.queue_counts(queue)[:ready]).to be < 300, "stopped in the middle"
      # Another worker's relay can take every row the first did not delete:
      # a row left leased (a batch in flight dropped) would wait out its lease.
      other = Patterns::OutboxRelay.new(mq, Patterns::SQLOutboxStore.new(connection: db, table: store.table,
                                                                          worker: "other"))
      nil until other.sweep.zero?
      expect(drain(queue, expect: 300).map { |_, body| JSON.parse(body)["n"] }.sort).to eq((0...300).to_a)
      expect(store.backlog.count).to eq(0)
    end

    it "calls the guide's on_error with the destination" do
      logged = []
      logger = Object.new
      logger.define_singleton_method(:warn) { |line| logged << line }
      missing = unique("orders-events")
      relay = Patterns::OutboxRelay.new(mq, store, on_error: lambda { |error, exchange:, routing_key:|
        logger.warn("outbox stuck on #{exchange}/#{routing_key}: #{error.message}")
      })
      db.transaction { store.add(Patterns.record(mq, { "n" => 1 }, to: "order.placed", exchange: missing), connection: db) }
      relay.sweep
      expect(logged.size).to eq(1)
      expect(logged.first).to start_with("outbox stuck on #{missing}/order.placed: ")
    end
  end

  RSpec.describe "the outbox on a SQLite3::Database" do
    let(:db) { outbox_sqlite(outbox_sqlite_path) }
    let(:store) { Patterns::SQLOutboxStore.new(connection: db, table: outbox_table) }

    it_behaves_like "an outbox in the caller's transaction"
  end

  RSpec.describe "the outbox on an ActiveRecord-style SQLite connection (results_as_hash)" do
    let(:db) { outbox_sqlite(outbox_sqlite_path, results_as_hash: true) }
    let(:store) { Patterns::SQLOutboxStore.new(connection: db, table: outbox_table) }

    it_behaves_like "an outbox in the caller's transaction"
  end

  RSpec.describe "the outbox on a SQLite file the library opens (path:)" do
    let(:path) { outbox_sqlite_path }
    let(:db) { outbox_sqlite(path) }
    let(:store) { Patterns::SQLOutboxStore.new(path: path, table: outbox_table) }

    it_behaves_like "an outbox in the caller's transaction"
  end

  RSpec.describe "the outbox on a PG::Connection" do
    let(:db) { outbox_pg }
    let(:table) { outbox_table }
    let(:store) { Patterns::SQLOutboxStore.new(connection: db, table: table) }

    before { pg_tables_to_drop << table }
    after { db.close }

    it_behaves_like "an outbox in the caller's transaction"
  end

  RSpec.describe "the outbox on a Mysql2::Client (MariaDB)" do
    let(:db) { outbox_mysql }
    let(:table) { outbox_table }
    let(:store) { Patterns::SQLOutboxStore.new(connection: db, table: table) }

    before { mysql_tables_to_drop << table }
    after { db.close }

    it_behaves_like "an outbox in the caller's transaction"

    it "stores a body past MySQL's 64 KiB TEXT, and four-byte UTF-8, and publishes them whole" do
      mq = AceMQ::AMQP::Connection.open(AMQP_URL)
      store.create_schema
      exchange, queue = destination(mq)
      big = { "note" => "\u{1F600}" + ("x" * 100_000) }
      db.transaction { store.add(Patterns.record(mq, big, to: "order.placed", exchange: exchange), connection: db) }
      expect(Patterns::OutboxRelay.new(mq, store).sweep).to eq(1)
      got = drain(queue, expect: 1)
      expect(JSON.parse(got.first.last)).to eq(big)
    ensure
      mq&.close
    end

    it "never hands one row to two relays claiming at once" do
      store.create_schema
      mq = AceMQ::AMQP::Connection.open(AMQP_URL)
      exchange, queue = destination(mq)
      db.transaction do
        200.times { |i| store.add(Patterns.record(mq, { "n" => i }, to: "order.placed", exchange: exchange), connection: db) }
      end
      relays = Array.new(4) do
        conn = mysql_client
        Patterns::OutboxRelay.new(mq, Patterns::SQLOutboxStore.new(connection: conn, table: table), batch_size: 7)
      end
      go = Queue.new
      threads = relays.map { |r| Thread.new { go.pop; n = 0; while (k = r.sweep).positive? do n += k end; n } }
      4.times { go << true }
      expect(threads.sum(&:value)).to eq(200)
      expect(drain(queue, expect: 200).map { |_, body| JSON.parse(body)["n"] }.sort).to eq((0...200).to_a)
    ensure
      mq&.close
    end
  end

  RSpec.describe "the outbox with a connection: callable over PostgreSQL" do
    let(:db) { outbox_pg }
    let(:table) { outbox_table }
    let(:store) { Patterns::SQLOutboxStore.new(connection: -> { db }, table: table) }

    before { pg_tables_to_drop << table }
    after { db.close }

    it_behaves_like "an outbox in the caller's transaction"
  end

  # The box in docs/outbox.md: ActiveRecord's raw SQLite connection hands rows
  # back as hashes, and add rides ActiveRecord's transaction.
  RSpec.describe "the outbox under ActiveRecord on SQLite" do
    let(:path) { outbox_sqlite_path }
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }

    before do
      require "active_record"
      ActiveRecord::Base.establish_connection(adapter: "sqlite3", database: path, timeout: 5000)
    end

    after do
      ActiveRecord::Base.remove_connection
      mq.close
    end

    it "adds in ActiveRecord's transaction, and the relay sweeps on a connection of its own (path:)" do
      raw = ActiveRecord::Base.connection.raw_connection
      expect(raw.results_as_hash).to be(true)
      table = outbox_table
      Patterns::SQLOutboxStore.new(connection: raw, table: table).create_schema
      relay_store = Patterns::SQLOutboxStore.new(path: path, table: table)
      exchange, queue = destination(mq)
      record = -> { Patterns.record(mq, { "order_id" => "A-1" }, to: "order.placed", exchange: exchange) }

      ActiveRecord::Base.transaction do
        relay_store.add(record.call, connection: ActiveRecord::Base.connection.raw_connection)
        raise ActiveRecord::Rollback
      end
      expect(relay_store.backlog.count).to eq(0)
      ActiveRecord::Base.transaction do
        relay_store.add(record.call, connection: ActiveRecord::Base.connection.raw_connection)
      end

      expect(Patterns::OutboxRelay.new(mq, relay_store).sweep).to eq(1)
      expect(drain(queue, expect: 1).size).to eq(1)
    end
  end
end
