# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "sqlite3"

# Delayed publish through the cascade on the real broker (docs/delays.md):
# not before it is due, the same envelope after, from a publish, a held and
# a streamed batch, and an outbox row. Delays are 1-3 s to keep the stage short.
RSpec.describe "delayed publish on RabbitMQ" do
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:queue) { unique("delay") }
  let(:got) { Queue.new }
  let(:started) { Process.clock_gettime(Process::CLOCK_MONOTONIC) }

  before do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    started
    @sub = mq.consume(queue) do |m|
      got << [m, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started]
      AceMQ::AMQP::Ack.accept
    end
  end

  after do
    @sub&.cancel
    mq.close
  end

  def take(timeout: 8)
    eventually(timeout: timeout) { got.pop(true) rescue nil }
  end

  it "delivers a 3 s delay (two levels: 2 s then 1 s) no earlier, with its id and trace context" do
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    env = mq.publish({ "n" => 1 }, to: queue, delay: 3, headers: { "traceparent" => trace })
    sleep 0.5
    expect(mq.delayed.sum(&:waiting)).to be >= 1
    message, after = take
    expect(after).to be >= 3.0
    expect(message.envelope.id).to eq(env.id)
    expect(message.envelope.headers["traceparent"]).to eq(trace)
    expect(message.envelope.headers["x-acemq-due"]).to be_a(Integer)
    expect(message.envelope.headers).not_to have_key("CC")
  end

  it "refuses a bad delay with ConfigurationError, and publishes the good ones before and after it" do
    mq.publish({ "n" => 1 }, to: queue, delay: 1)
    expect { mq.publish({ "n" => 2 }, to: queue, delay: -1) }.to raise_error(AceMQ::AMQP::ConfigurationError, /0 or more/)
    expect { mq.publish({ "n" => 2 }, to: queue, delay: 10**10) }.to raise_error(AceMQ::AMQP::ConfigurationError, /at most/)
    expect { mq.publish({ "n" => 2 }, to: queue, delay: 1, at: Time.now) }.to raise_error(AceMQ::AMQP::ConfigurationError, /not both/)
    mq.publish({ "n" => 3 }, to: queue, at: Time.now + 1)
    expect([take, take].map { |m, _| m.payload["n"] }).to contain_exactly(1, 3)
  end

  it "delays from a held batch, a streamed batch and an outbox row, and to an exchange with its routing key" do
    exchange = unique("delay-ex")
    bound = unique("delay-bound")
    AceMQ::AMQP::Topology.new.exchange(exchange, type: :topic).queue(bound).bind(bound, to: exchange, routing_key: "order.*")
                         .apply(mq)
    bound_got = Queue.new
    sub = mq.consume(bound) { |m| bound_got << m; AceMQ::AMQP::Ack.accept }
    mq.batch { |b| b.publish({ "n" => "held" }, to: queue, delay: 1) }
    mq.batch(stream: true) { |b| b.publish({ "n" => "streamed" }, to: queue, delay: 1) }
    db = SQLite3::Database.new(":memory:")
    store = AceMQ::AMQP::Patterns::SQLOutboxStore.new(connection: db)
    store.create_schema
    store.add(AceMQ::AMQP::Patterns.record(mq, { "n" => "outbox" }, to: queue, delay: 2), connection: db)
    AceMQ::AMQP::Patterns::OutboxRelay.new(mq, store).sweep
    mq.publish({ "n" => "routed" }, to: "order.placed", exchange: exchange, delay: 1)
    expect(Array.new(3) { take.first.payload["n"] }).to contain_exactly("held", "streamed", "outbox")
    routed = eventually(timeout: 8) { bound_got.pop(true) rescue nil }
    expect(routed.payload["n"]).to eq("routed")
    sub.cancel
  end
end
