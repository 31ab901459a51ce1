# frozen_string_literal: true

require "acemq/amqp/patterns"
require "tmpdir"
require "sqlite3"

# The broker going away — a restart, a network cut — is simulated by the
# broker closing our connection (rabbitmqctl close_connection, found by the
# connection's name, which is its origin). lapin does not recover on its
# own; AceMQ dials again on the next use and subscribes again by itself.
RSpec.describe "surviving the broker going away and coming back" do
  let(:origin) { unique("recovery") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: origin) }
  let(:queue) { unique("recover") }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
  after { mq.close }

  it "keeps a subscription consuming and a publisher publishing" do
    got = Queue.new
    errors = Queue.new
    sub = mq.consume(queue, on_error: ->(e) { errors << e }) { |m| got << m.payload["n"]; AceMQ::AMQP::Ack.accept }
    mq.publish({ "n" => 1 }, to: queue)
    expect(eventually { got.pop(true) rescue nil }).to eq(1)

    broker_closes_connections(origin)
    # The first publish after the cut may fail while the connection is dialled
    # again; the caller sees an error, never a silent loss.
    eventually(timeout: 10) do
      mq.publish({ "n" => 2 }, to: queue)
    rescue AceMQ::AMQP::ConnectionError, AceMQ::AMQP::TimeoutError
      nil
    end
    expect(eventually(timeout: 10) { got.pop(true) rescue nil }).to eq(2)
    expect(sub).to be_alive
    # Not silent: on_error heard that it lost its channel and came back.
    error = eventually(timeout: 5) { errors.pop(true) rescue nil }
    expect(error).to be_a(AceMQ::AMQP::ConnectionClosed)
    expect(error.message).to include("lost its channel and subscribed again (1 time so far)")
    expect(sub.resubscriptions).to eq(1)
    sub.cancel
  end

  it "keeps an outbox relay relaying, with no row lost and no busy loop" do
    Dir.mktmpdir do |dir|
      store = AceMQ::AMQP::Patterns::SQLOutboxStore.new(path: File.join(dir, "outbox.db"))
      store.create_schema
      db = SQLite3::Database.new(File.join(dir, "outbox.db"))
      add = ->(n) { store.add(AceMQ::AMQP::Patterns.record(mq, { "n" => n }, to: queue), connection: db) }
      errors = Queue.new
      relay = AceMQ::AMQP::Patterns::OutboxRelay.new(mq, store, interval: 0.2,
                                                               on_error: ->(e, exchange:, routing_key:) { errors << e })
      5.times { |n| add.call(n) }
      expect(relay.sweep).to eq(5)

      broker_closes_connections(origin)
      5.times { |n| add.call(5 + n) }
      relay.start
      eventually(timeout: 15) { store.backlog.count.zero? }
      relay.close
      expect(errors.size).to be < 10 # a few failed sweeps while it dialled again, not a busy loop
      got = []
      sub = mq.consume(queue) { |m| got << m.payload["n"]; AceMQ::AMQP::Ack.accept }
      eventually { got.size >= 10 }
      sub.cancel
      expect(got.sort).to eq((0...10).to_a)
      db.close
    end
  end

  it "keeps its connection through a handler that runs three heartbeat intervals" do
    hb_origin = unique("heartbeat")
    conn = AceMQ::AMQP::Connection.open(AMQP_URL, origin: hb_origin, heartbeat: 1)
    AceMQ::AMQP::Topology.new.queue(queue).apply(conn)
    done = Queue.new
    sub = conn.consume(queue) do |m|
      sleep 3.5 if m.payload["slow"] # the I/O thread keeps heartbeating meanwhile
      done << m
      AceMQ::AMQP::Ack.accept
    end
    conn.publish({ "slow" => true }, to: queue)
    conn.publish({ "n" => 2 }, to: queue)
    first = eventually(timeout: 10) { done.pop(true) rescue nil }
    second = eventually(timeout: 10) { done.pop(true) rescue nil }
    expect([first.payload, second.payload]).to eq([{ "slow" => true }, { "n" => 2 }])
    expect(first.delivery).not_to be_redelivered
    expect(sub.failure).to be_nil # the subscription never lost its channel
    listing = `rabbitmqctl list_connections client_properties timeout 2>/dev/null`
    mine = listing.lines.select { |l| l.include?(%({"connection_name","#{hb_origin}"})) }
    expect(mine.size).to eq(1)
    expect(mine.first.split("\t").last.to_i).to eq(1) # the heartbeat it asked for
    sub.cancel
    conn.close
  end
end
