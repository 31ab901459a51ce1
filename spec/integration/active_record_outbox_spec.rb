# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "acemq/rails/outbox"

# The outbox in an ActiveRecord application: add rides the caller's
# ActiveRecord::Base.transaction on its own connection, and the relay's
# store has a connection of its own built from ActiveRecord's database —
# on SQLite and PostgreSQL, published to RabbitMQ.
module ActiveRecordOutboxSpec
  Patterns = AceMQ::AMQP::Patterns

  RSpec.shared_examples "an outbox under ActiveRecord" do
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
    let(:table) { outbox_table("ar_outbox") }
    let(:outbox) { AceMQ::Rails::Outbox.new(table: table) }
    let(:orders) { Class.new(ActiveRecord::Base) { self.table_name = "orders" } }

    before do
      ActiveRecord::Base.connection.create_table(:orders, id: false) do |t|
        t.string :id, primary_key: true
        t.integer :total, null: false
      end
      outbox.create_schema
    end

    after do
      outbox.close
      mq.close
    end

    def record(order_id = "A-1", exchange: @exchange)
      Patterns.record(mq, { "order_id" => order_id }, to: "order.placed", exchange: exchange || "",
                                                         type: "order.placed.v2")
    end

    it "adds in the caller's transaction: committed with the order, rolled back with it" do
      ActiveRecord::Base.transaction do
        # First thing in the transaction: ActiveRecord has not sent its
        # BEGIN yet (it begins lazily), and the add must be inside it anyway.
        outbox.add(record("R-1"))
        orders.create!(id: "R-1", total: 10)
        raise ActiveRecord::Rollback
      end
      expect(outbox.backlog.count).to eq(0)
      expect(orders.count).to eq(0)

      expect do
        ActiveRecord::Base.transaction do
          orders.create!(id: "R-2", total: 20)
          outbox.add(record("R-2"))
          raise "the charge failed"
        end
      end.to raise_error(RuntimeError, "the charge failed")
      expect(outbox.backlog.count).to eq(0)

      id = nil
      ActiveRecord::Base.transaction do
        orders.create!(id: "C-1", total: 30)
        id = outbox.add(record("C-1"))
      end
      expect(id).to be_a(Integer).and be_positive
      expect(outbox.backlog.count).to eq(1)
      expect(orders.count).to eq(1)
    end

    it "takes the app's ActiveRecord connection or pool directly in store.add(…, connection:)" do
      store = outbox.store
      ActiveRecord::Base.transaction do
        store.add(record("P-1"), connection: ActiveRecord::Base.connection)
        store.add(record("P-2"), connection: ActiveRecord::Base.connection_pool)
        raise ActiveRecord::Rollback
      end
      expect(store.backlog.count).to eq(0)

      ids = ActiveRecord::Base.transaction do
        [store.add(record("P-3"), connection: ActiveRecord::Base.connection),
         store.add(record("P-4"), connection: ActiveRecord::Base.connection_pool)]
      end
      # The pool's add asks for the row's id on the connection that inserted it.
      expect(ids[1]).to eq(ids[0] + 1)
      ActiveRecord::Base.connection_pool.release_connection
      expect(store.add(record("P-5"), connection: ActiveRecord::Base.connection_pool)).to eq(ids[1] + 1)
      expect(store.backlog.count).to eq(3)
    end

    it "relays from a connection of its own, on the same database as ActiveRecord's" do
      @exchange, queue = destination(mq)
      added = record("S-1")
      ActiveRecord::Base.transaction do
        orders.create!(id: "S-1", total: 10)
        outbox.add(added)
      end
      expect(outbox.relay(mq).sweep).to eq(1)
      got = drain(queue, expect: 1)
      expect(got.size).to eq(1)
      expect(JSON.parse(got[0][1])).to eq("order_id" => "S-1")
      expect(got[0][0].to_hash).to include(type: "order.placed.v2", message_id: added.id)
      expect(outbox.backlog.count).to eq(0)
      expect(dedicated_source).not_to be_nil
    end

    it "runs the relay on its own thread, which never uses ActiveRecord's connection" do
      @exchange, queue = destination(mq)
      relay = outbox.relay(mq, interval: 0.05)
      relay.start
      3.times { |i| ActiveRecord::Base.transaction { outbox.add(record("T-#{i}")) } }
      got = eventually(timeout: 10) { (r = drain(queue, expect: 3, timeout: 2)).size == 3 && r }
      expect(got.map { |_, body| JSON.parse(body)["order_id"] }.sort).to eq(%w[T-0 T-1 T-2])
      relay.close
      expect(ActiveRecord::Base.connection_pool.connections.count(&:in_use?)).to be <= 1 # this thread's, if any
    end

    it "is built once per process, and again in a forked child" do
      parent_store = outbox.store
      expect(outbox.store).to be(parent_store)
      disconnect_before_fork
      config = @ar_config
      box = outbox
      pid, out = spawn_child do |o|
        ActiveRecord::Base.establish_connection(config)
        child_store = box.store
        o.puts(child_store.equal?(parent_store) ? "shared" : "own")
        ActiveRecord::Base.transaction { box.add(Patterns.record(AceMQ::AMQP::Connection.open("memory://x"), {}, to: "q")) }
        o.puts(child_store.backlog.count)
      end
      expect(read_line(out)).to eq("own")
      expect(read_line(out)).to eq("1")
      expect(wait_child(pid)).to be_success
      expect(outbox.backlog.count).to eq(1)
    end

    it "refuses unknown options, saying which ones there are" do
      expect { AceMQ::Rails::Outbox.new(tabel: "x") }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /unknown Outbox option\(s\) tabel: use model:, table:/)
    end
  end

  RSpec.describe "the ActiveRecord outbox on SQLite" do
    before { @ar_config = establish_active_record(:sqlite) }

    def dedicated_source
      source = AceMQ::Rails::ActiveRecordSource.dedicated
      expect(source).to eq(path: File.realpath(@ar_config[:database]))
      source
    end

    it_behaves_like "an outbox under ActiveRecord"

    it "has no connection of its own to give an in-memory database" do
      ActiveRecord::Base.establish_connection(adapter: "sqlite3", database: ":memory:")
      expect { AceMQ::Rails::ActiveRecordSource.dedicated }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /in memory.*use a database file/)
    end
  end

  RSpec.describe "the ActiveRecord outbox on MariaDB (mysql2)" do
    before { @ar_config = establish_active_record(:mysql) }

    def dedicated_source
      source = AceMQ::Rails::ActiveRecordSource.dedicated
      expect(source.keys).to eq([:connection])
      relay_id = source[:connection].checkout.query("SELECT CONNECTION_ID(), DATABASE()", []).first
      app_id = ActiveRecord::Base.connection.select_value("SELECT CONNECTION_ID()")
      expect(relay_id.first).not_to eq(app_id)
      expect(relay_id.last).to eq(@ar_config[:database])
      source[:connection].close
      source
    end

    it_behaves_like "an outbox under ActiveRecord"
  end

  RSpec.describe "the ActiveRecord outbox on PostgreSQL", skip: (ActiveRecordSpecHelpers.postgres? ? false : "DATABASE_URL is not set") do
    before { @ar_config = establish_active_record(:postgres) }

    def dedicated_source
      source = AceMQ::Rails::ActiveRecordSource.dedicated
      expect(source.keys).to eq([:connection])
      backend = ->(adapter) { adapter.query("SELECT pg_backend_pid(), current_schema()", []).first }
      relay_pid, schema = backend.call(source[:connection].checkout)
      app_pid = ActiveRecord::Base.connection.select_value("SELECT pg_backend_pid()")
      expect(relay_pid).not_to eq(app_pid)
      expect(schema).to eq(@ar_config[:schema_search_path]) # ActiveRecord's schema_search_path, set again
      source[:connection].close
      source
    end

    it_behaves_like "an outbox under ActiveRecord"

    it "never commits the app's half-done transaction: the relay's claim does not see it" do
      @exchange, queue = destination(mq = AceMQ::AMQP::Connection.open(AMQP_URL))
      outbox = AceMQ::Rails::Outbox.new(table: outbox_table("ar_outbox"))
      outbox.create_schema
      relay = outbox.relay(mq)
      ActiveRecord::Base.transaction do
        outbox.add(Patterns.record(mq, { "order_id" => "H-1" }, to: "order.placed", exchange: @exchange))
        expect(relay.sweep).to eq(0) # its own connection: the row is not committed
        raise ActiveRecord::Rollback
      end
      expect(outbox.backlog.count).to eq(0)
      expect(drain(queue, timeout: 1)).to be_empty
    ensure
      outbox&.close
      mq&.close
    end
  end
end
