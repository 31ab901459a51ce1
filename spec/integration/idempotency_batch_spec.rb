# frozen_string_literal: true

require "acemq/amqp/patterns"
require "sqlite3"
require "pg"
require "tmpdir"

# consume(batch:) with the SQL store on RabbitMQ: one claim statement and one
# confirm statement per batch, and still one charge per key with every message
# delivered twice.
RSpec.describe "batched idempotent consume on RabbitMQ" do
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:queue) { unique("idem-batch") }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
  after { mq.close }

  shared_examples "one charge per key" do
    it "charges each key once when every message arrives twice" do
      charges = Hash.new(0)
      lock = Mutex.new
      handler = AceMQ::AMQP::Patterns.idempotent(store) do |m|
        lock.synchronize { charges[m.envelope.id] += 1 }
        AceMQ::AMQP::Ack.accept
      end
      envelopes = Array.new(60) { AceMQ::AMQP::Envelope.new(type: "payment.requested.v1") }
      mq.batch { |b| envelopes.each { |e| 2.times { b.publish({ "x" => 1 }, to: queue, envelope: e) } } }
      sub = mq.consume(queue, prefetch: 100, batch: 50, retries: { max_attempts: 10, initial_delay: 0.1, max_delay: 0.2 },
                              &handler)
      eventually(timeout: 15) { sub.stats[:accepted] == 120 }
      sub.cancel
      expect(charges.keys).to match_array(envelopes.map(&:id))
      expect(charges.values.uniq).to eq([1])
      expect(envelopes.map { |e| store.confirmed?(e.id) }).to all(be(true))
    end
  end

  context "with SQLite through the sqlite3 driver" do
    around { |ex| Dir.mktmpdir { |dir| @dir = dir; ex.run } }
    let(:db) { SQLite3::Database.new(File.join(@dir, "keys.db")).tap { |d| d.busy_timeout = 5000 } }
    let(:store) { AceMQ::AMQP::Patterns::SQLIdempotencyStore.new(connection: db).tap(&:create_schema) }

    include_examples "one charge per key"
  end

  context "with PostgreSQL" do
    let(:pg) { PG.connect(DATABASE_URL) }
    let(:table) { "idem_batch_#{SecureRandom.hex(4)}" }
    let(:store) { AceMQ::AMQP::Patterns::SQLIdempotencyStore.new(connection: pg, table: table).tap(&:create_schema) }

    after do
      pg.exec("DROP TABLE IF EXISTS #{table}")
      pg.close
    end

    include_examples "one charge per key"
  end
end
