# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "sqlite3"
require "pg"

# relay.start wakes when a row is committed, not an interval later: every
# relay here has an interval of an hour, so a row that arrives within the
# spec's few seconds was fetched by the wake-up. PostgreSQL's comes from the
# add's NOTIFY (delivered at commit to the relay's LISTEN connection, from
# any process); SQLite's from an add in this process, for a path: store.
module OutboxWakeSpec
  Patterns = AceMQ::AMQP::Patterns
  HOUR = 3600

  RSpec.describe "a started outbox relay's wake-up" do
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
    let(:errors) { [] }
    after { mq.close }

    def relay_for(store)
      Patterns::OutboxRelay.new(mq, store, interval: HOUR, on_error: ->(e, **) { errors << e }).tap(&:start)
    end

    def add_in_transaction(store, db, queue, rollback: false)
      record = Patterns.record(mq, { "n" => 1 }, to: "order.placed", exchange: queue.first)
      db.transaction do
        store.add(record, connection: db)
        # Held open: a relay woken by the add itself must still wait for the commit.
        sleep 0.2
        raise ArgumentError, "rolled back" if rollback
      end
      record.id
    rescue ArgumentError
      record.id
    end

    context "on PostgreSQL (LISTEN/NOTIFY)" do
      let(:table) { outbox_table }
      let(:relay_db) { outbox_pg }
      let(:store) { Patterns::SQLOutboxStore.new(connection: relay_db, table: table) }
      before do
        pg_tables_to_drop << table
        store.create_schema
      end
      after { relay_db.close }

      it "publishes a row committed by another process at once, and nothing for a rollback" do
        exchange, queue = destination(mq)
        relay = relay_for(store)
        sleep 0.3 # the first sweep and the LISTEN
        # Another process adds: only a notification can reach this relay.
        script = <<~RUBY
          $LOAD_PATH.unshift(#{File.expand_path('../../lib', __dir__).inspect})
          require "acemq"
          require "acemq/amqp/patterns"
          require "pg"
          mq = AceMQ::AMQP::Connection.open(#{AMQP_URL.inspect})
          db = PG.connect(#{AceMQSpecHelpers::DATABASE_URL.inspect})
          store = AceMQ::AMQP::Patterns::SQLOutboxStore.new(connection: db, table: #{table.inspect})
          rec = AceMQ::AMQP::Patterns.record(mq, { "n" => 1 }, to: "order.placed", exchange: #{exchange.inspect})
          db.transaction { store.add(rec, connection: db) }
          puts rec.id
          mq.close
        RUBY
        id = IO.popen([RbConfig.ruby, "-e", script], &:read).strip
        expect($?).to be_success
        (props, _), = drain(queue, expect: 1, timeout: 5)
        expect(props && props[:message_id]).to eq(id)

        local = Patterns::SQLOutboxStore.new(connection: outbox_pg, table: table)
        add_in_transaction(local, local_db = outbox_pg, [exchange], rollback: true)
        expect(drain(queue, timeout: 1)).to be_empty
        expect(store.backlog.count).to eq(0)
        local_db.close
        relay.close
        expect(errors).to be_empty
      end
    end

    context "on PostgreSQL, when the LISTEN connection is cut" do
      let(:table) { outbox_table }
      let(:relay_db) { outbox_pg }
      let(:admin) { outbox_pg }
      let(:store) { Patterns::SQLOutboxStore.new(connection: relay_db, table: table) }
      before do
        pg_tables_to_drop << table
        store.create_schema
      end
      after do
        relay_db.close
        admin.close
      end

      def listeners
        admin.exec_params("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() " \
                          "AND query ILIKE $1", ["LISTEN%#{table}%"]).map { _1["pid"].to_i }
      end

      # The relay's LISTEN connection goes (a server restart, a failover, an
      # idle-connection reaper): it listens again, and a row committed after
      # that is published at once, not an hour later.
      it "listens again on a connection of its own and is woken by the next commit, each of 3 times" do
        exchange, queue = destination(mq)
        relay = relay_for(store)
        adding = Patterns::SQLOutboxStore.new(connection: admin, table: table)
        3.times do |round|
          eventually(timeout: 10) { listeners.size == 1 }
          cut = listeners.first
          admin.exec_params("SELECT pg_terminate_backend($1)", [cut])
          eventually(timeout: 10) { listeners.size == 1 && listeners.first != cut }
          id = add_in_transaction(adding, admin, [exchange])
          (props, _), = drain(queue, expect: 1, timeout: 5)
          expect(props && props[:message_id]).to eq(id), "round #{round}: the row was not published within 5 s"
        end
        # Each loss was told to on_error, and nothing else was.
        expect(errors.size).to eq(3), errors.inspect
        expect(errors).to all(be_a(PG::Error))
        # Its interval is an hour: close ends the wait between sweeps and the
        # LISTEN thread at once.
        t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        relay.close
        expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0).to be < 3
        expect(relay).not_to be_running
        expect(Thread.list.map(&:name)).not_to include("acemq-outbox-listen")
        expect(listeners).to eq([])
        expect(store.backlog.count).to eq(0)
      end
    end

    context "on SQLite, a path: store and an add in this process" do
      let(:path) { outbox_sqlite_path }
      let(:table) { outbox_table }
      let(:store) { Patterns::SQLOutboxStore.new(path: path, table: table) }
      let(:app) { outbox_sqlite(path) }
      before { store.create_schema }
      after { app.close }

      it "publishes the row right after its transaction commits" do
        exchange, queue = destination(mq)
        relay = relay_for(store)
        sleep 0.3
        adding = Patterns::SQLOutboxStore.new(connection: app, table: table)
        id = add_in_transaction(adding, app, [exchange])
        (props, _), = drain(queue, expect: 1, timeout: 5)
        expect(props && props[:message_id]).to eq(id)
        relay.close
        expect(errors).to be_empty
      end
    end

    it "takes its interval and batch size from core, defaults and checks included" do
      store = Patterns::SQLOutboxStore.new(path: outbox_sqlite_path)
      relay = Patterns::OutboxRelay.new(mq, store)
      expect([relay.interval, relay.batch_size]).to eq([1.0, 100])
      expect { Patterns::OutboxRelay.new(mq, store, interval: 0) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /interval must be more than zero/)
      expect { Patterns::OutboxRelay.new(mq, store, batch_size: -1) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /batch size must be at least 1/)
    end
  end
end
