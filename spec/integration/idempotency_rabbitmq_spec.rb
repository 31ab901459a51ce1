# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "sqlite3"

# Tutorial 3, Steps 2 and 3, against RabbitMQ: the same envelope published
# twice is one message id twice, which is what a redelivery looks like from
# inside a handler.
RSpec.describe "Tutorial 3 against RabbitMQ" do

  let(:queue) { unique("payments") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:charged) { Queue.new }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }

  after do
    @sub&.cancel
    mq.close
  end

  def publish_twice
    envelope = AceMQ::AMQP::Envelope.new(type: "payment.requested.v1")
    2.times { mq.publish({ "order_id" => "A-1", "amount" => 4200 }, to: queue, envelope: envelope) }
    envelope
  end

  def charges_after_both_settle
    eventually(timeout: 10) { @sub.stats[:accepted] == 2 }
    Array.new(charged.size) { charged.pop }
  end

  it "Step 2: InMemoryIdempotencyStore charges once" do
    store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new(window: 6 * 3600)
    @sub = mq.consume(queue, &AceMQ::AMQP::Patterns.idempotent(store) do |message|
      charged << message.payload["order_id"]
      AceMQ::AMQP::Ack.accept
    end)
    publish_twice

    expect(charges_after_both_settle).to eq(["A-1"])
  end

  it "Step 3: SQLIdempotencyStore on a SQLite3::Database charges once, and remembers it" do
    db = SQLite3::Database.new(sqlite_path)
    store = AceMQ::AMQP::Patterns::SQLIdempotencyStore.new(connection: db)
    store.create_schema
    guarded = AceMQ::AMQP::Patterns.idempotent(store) do |message|
      charged << message.payload["order_id"]
      AceMQ::AMQP::Ack.accept
    end
    @sub = mq.consume(queue, &guarded)
    envelope = publish_twice

    expect(charges_after_both_settle).to eq(["A-1"])
    @sub.cancel
    expect(store.confirmed?(envelope.id.b)).to be(true)
    expect(guarded.stats[:duplicates]).to eq(1)
  ensure
    db&.close
  end

  it "dead-letters a message whose key function finds nothing, with the reason" do
    store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new
    @sub = mq.consume(queue, &AceMQ::AMQP::Patterns.idempotent(store, key: ->(m) { m.payload["order_id"] }) do |_m|
      charged << :ran
      AceMQ::AMQP::Ack.accept
    end)
    mq.publish({ "amount" => 4200 }, to: queue)

    eventually(timeout: 10) { @sub.stats[:dead_lettered] == 1 }
    expect(charged).to be_empty
  end
end
