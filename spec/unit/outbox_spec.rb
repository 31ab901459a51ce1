# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "acemq/tasks/outbox"
require "sqlite3"

module OutboxUnitSpec
  Patterns = AceMQ::AMQP::Patterns

  # The outbox's Ruby API without RabbitMQ: memory:// and SQLite files.
  RSpec.describe "the outbox (memory://, SQLite)" do
    let(:mq) { AceMQ::AMQP::Connection.open(memory_url, origin: "billing@test") }
    let(:path) { outbox_sqlite_path }
    let(:db) { outbox_sqlite(path) }
    # Made before any transaction: a table created inside one would roll back with it.
    let!(:store) { Patterns::SQLOutboxStore.new(connection: db, table: outbox_table).tap(&:create_schema) }
    let(:queue) { unique("q") }

    before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
    after { mq.close unless mq.closed? }

    def add(n, to: queue, exchange: "")
      db.transaction do
        n.times { |i| store.add(Patterns.record(mq, { "n" => i }, to: to, exchange: exchange), connection: db) }
      end
    end

    # Break-it: listen: "" or {} had libpq fall back to its defaults (the
    # OS user's database), where no add notifies, silently; 42 and true
    # were dialled as host names; a connect that never answered was never
    # told.
    describe "OutboxRelay's listen:" do
      it "refuses what cannot be PostgreSQL's connection settings, saying what it takes" do
        ["", "  ", {}, 42, true, [], :db].each do |bad|
          expect { Patterns::OutboxRelay.new(mq, store, listen: bad) }
            .to raise_error(AceMQ::AMQP::ConfigurationError, /listen: takes PostgreSQL's connection settings .* or false/)
        end
        expect(Patterns::OutboxRelay.new(mq, store, listen: false)).to be_a(Patterns::OutboxRelay)
        expect(Patterns::OutboxRelay.new(mq, store, listen: "host=db dbname=app")).to be_a(Patterns::OutboxRelay)
      end

      it "bounds the LISTEN connection's connect unless the settings name their own" do
        require "pg"
        bounded = Patterns::OutboxListener.method(:bounded)
        expect(bounded.call("host=db dbname=app")).to eq(["host=db dbname=app", { connect_timeout: 10 }])
        expect(bounded.call("postgres://u@db/app")).to eq(["postgres://u@db/app", { connect_timeout: 10 }])
        expect(bounded.call("host=db connect_timeout=3")).to eq(["host=db connect_timeout=3"])
        expect(bounded.call({ host: "db" })).to eq([{ host: "db", connect_timeout: 10 }])
        expect(bounded.call({ host: "db", connect_timeout: 2 })).to eq([{ host: "db", connect_timeout: 2 }])
      end
    end

    describe "Patterns.record" do
      it "builds the envelope by publish's rules, with this connection's origin" do
        before = Time.now.to_i
        r = Patterns.record(mq, { order_id: "A-1" }, to: "order.placed", exchange: "orders-events",
                                                      type: "order.placed.v2", headers: { tenant: "acme" })
        expect(r.exchange).to eq("orders-events")
        expect(r.routing_key).to eq("order.placed")
        expect(r.body).to eq('{"order_id":"A-1"}')
        expect(r.payload).to eq("order_id" => "A-1")
        env = r.envelope
        expect(env.id).to match(/\A\h{8}-\h{4}-7\h{3}-\h{4}-\h{12}\z/)
        expect(env.type).to eq("order.placed.v2")
        expect(env.origin).to eq("billing@test")
        expect(env.timestamp).to be_between(before, Time.now.to_i)
        expect(env.attempt).to eq(1)
        expect(env.headers).to eq("tenant" => "acme")
        expect(Patterns.record(mq, {}, to: "q").id).not_to eq(r.id)
      end

      it "refuses what publish refuses, when the record is built rather than at every sweep" do
        expect { Patterns.record(mq, Object.new.tap { |o| def o.to_json(*) = raise(TypeError, "no") }, to: "q") }
          .to raise_error(AceMQ::AMQP::EncodingError)
        expect { Patterns.record(mq, {}, to: "") }.to raise_error(AceMQ::AMQP::ConfigurationError, /needs a destination/)
        expect { Patterns.record(:not_a_connection, {}, to: "q") }.to raise_error(AceMQ::AMQP::ConfigurationError)
        expect { Patterns::OutboxRecord.new }.to raise_error(NoMethodError, /Patterns.record/)
      end
    end

    describe "SQLOutboxStore" do
      it "takes connection: or path:, exactly one" do
        expect { Patterns::SQLOutboxStore.new }.to raise_error(AceMQ::AMQP::ConfigurationError, /exactly one/)
        expect { Patterns::SQLOutboxStore.new(connection: db, path: path) }.to raise_error(AceMQ::AMQP::ConfigurationError)
        expect { Patterns::SQLOutboxStore.new(connection: Object.new) }.to raise_error(AceMQ::AMQP::SQL::UnsupportedConnection)
      end

      it "adds only with the connection it is handed, and only records" do
        r = Patterns.record(mq, {}, to: queue)
        expect { store.add(r) }.to raise_error(ArgumentError, /connection/)
        expect { store.add({ "n" => 1 }, connection: db) }.to raise_error(AceMQ::AMQP::ConfigurationError, /Patterns.record/)
      end

      it "neither commits nor closes: a rolled-back add is gone, a committed one stays" do
        expect do
          db.transaction do
            store.add(Patterns.record(mq, {}, to: queue), connection: db)
            raise KeyError, "the business write failed"
          end
        end.to raise_error(KeyError)
        expect(store.backlog.to_h).to eq(count: 0, oldest_age: nil, stuck: 0)
        id = nil
        db.transaction { id = store.add(Patterns.record(mq, {}, to: queue), connection: db) }
        expect(id).to be_a(Integer)
        expect(db.closed?).to be(false)
        expect(store.backlog).to have_attributes(count: 1, stuck: 0)
        expect(store.backlog.oldest_age).to be_between(0, 5)
      end

      it "names its table in the schema it would create, for a migration" do
        expect(store.schema_sql(:postgres).first).to include("CREATE TABLE IF NOT EXISTS #{store.table}", "BIGSERIAL")
        expect(store.schema_sql(:sqlite).first).to include("AUTOINCREMENT")
      end
    end

    describe "OutboxRelay" do
      it "sweeps one batch and returns how many went out" do
        add(5)
        relay = Patterns::OutboxRelay.new(mq, store, batch_size: 3)
        expect(relay.sweep).to eq(3)
        expect(relay.sweep).to eq(2)
        expect(relay.sweep).to eq(0)
        expect(mq.queue_depth(queue)).to eq(ready: 5, unacked: 0)
      end

      it "sweeps again at once while batches come back full, and close stops it" do
        add(50)
        relay = Patterns::OutboxRelay.new(mq, store, interval: 30, batch_size: 10)
        relay.start
        expect(relay.start).to be(relay) # starting a started relay does nothing
        eventually(timeout: 3) { mq.queue_depth(queue)[:ready] == 50 }
        relay.close
        expect(relay.running?).to be(false)
        expect(store.backlog.count).to eq(0)
        expect { relay.start }.to raise_error(AceMQ::AMQP::ConnectionClosed)
      end

      it "keeps going without a busy loop when the broker is gone: rows are retried after a backoff" do
        add(3)
        errors = Queue.new
        relay = Patterns::OutboxRelay.new(mq, store, interval: 0.05, on_error: lambda { |error, exchange:, routing_key:|
          errors << [error.class, exchange, routing_key]
        })
        mq.close
        relay.start
        eventually(timeout: 3) { store.backlog.stuck == 3 }
        sleep 0.4 # the 1 s backoff has not passed: nothing is tried again
        relay.close
        expect(errors.size).to eq(3)
        expect(errors.pop).to eq([AceMQ::AMQP::ConnectionClosed, "", queue])
        expect(store.stuck.map(&:attempts)).to eq([1, 1, 1])
      end

      it "reports a failed sweep with no destination and keeps going after a brief database error" do
        add(2)
        failures = 2
        flaky = lambda do
          if failures.positive?
            failures -= 1
            raise SQLite3::BusyException, "database is locked"
          end
          db
        end
        errors = Queue.new
        relay = Patterns::OutboxRelay.new(mq, Patterns::SQLOutboxStore.new(connection: flaky, table: store.table),
                                          interval: 0.05, on_error: lambda { |error, exchange:, routing_key:|
                                            errors << [error, exchange, routing_key]
                                          })
        # Someone listens to outbox.acemq: a failed sweep has no event, so
        # the relay must not read the backlog for one (it did, and that read
        # used up the second failure unreported).
        events = []
        listener = AceMQ::Events.subscribe("outbox.acemq") { |e| events << e }
        begin
          relay.start
          eventually(timeout: 3) { mq.queue_depth(queue)[:ready] == 2 }
          relay.close
        ensure
          AceMQ::Events.unsubscribe(listener)
        end
        error, exchange, routing_key = errors.pop
        expect(error).to be_a(AceMQ::AMQP::StoreError)
        expect(error.message).to include("database is locked")
        expect([exchange, routing_key]).to eq([nil, nil])
        expect(errors.size).to eq(1)
      end

      it "survives an on_error that raises" do
        add(1, exchange: "no-such-exchange", to: "x")
        add(1)
        relay = Patterns::OutboxRelay.new(mq, store, interval: 0.05, on_error: ->(*, **) { raise "broken logger" })
        expect do
          relay.start
          eventually(timeout: 3) { mq.queue_depth(queue)[:ready] == 1 }
          relay.close
        end.to output(/on_error raised RuntimeError: broken logger/).to_stderr
        expect(store.stuck.first).to have_attributes(exchange: "no-such-exchange", attempts: 1)
      end

      it "refuses what it cannot work with" do
        expect { Patterns::OutboxRelay.new(:mq, store) }.to raise_error(AceMQ::AMQP::ConfigurationError)
        expect { Patterns::OutboxRelay.new(mq, Object.new) }.to raise_error(AceMQ::AMQP::ConfigurationError)
        expect { Patterns::OutboxRelay.new(mq, store, interval: 0) }.to raise_error(AceMQ::AMQP::ConfigurationError)
        expect { Patterns::OutboxRelay.new(mq, store, batch_size: 0) }.to raise_error(AceMQ::AMQP::ConfigurationError)
        expect { Patterns::OutboxRelay.new(mq, store, on_error: 1) }.to raise_error(AceMQ::AMQP::ConfigurationError)
      end
    end

    describe "the acemq:outbox:backlog task" do
      it "prints the backlog and the stuck rows, and alarms past ACEMQ_OUTBOX_MAX_AGE" do
        add(1, exchange: "no-such-exchange", to: "x")
        add(1)
        Patterns::OutboxRelay.new(mq, store).sweep
        report = AceMQ::OutboxTasks.backlog_report(store, max_age: nil)
        expect(report[:text]).to start_with("outbox #{store.table}: 1 waiting, oldest ")
        expect(report[:text]).to match(%r{1 failing\n  #\d+ no-such-exchange/x attempts=1 next=\S+: .+})
        expect(report[:alarm]).to be(false)
        expect(AceMQ::OutboxTasks.backlog_report(store, max_age: "3600")[:alarm]).to be(true)

        out = StringIO.new
        ENV["ACEMQ_OUTBOX_PATH"] = path
        ENV["ACEMQ_OUTBOX_TABLE"] = store.table
        Rake::Task.define_task(:noop) # a Rake application exists
        task = AceMQ::OutboxTasks.install(name: unique("acemq:outbox:backlog"), out: out)
        task.invoke
        expect(out.string).to include("1 waiting")
      ensure
        ENV.delete("ACEMQ_OUTBOX_PATH")
        ENV.delete("ACEMQ_OUTBOX_TABLE")
      end
    end
  end
end
