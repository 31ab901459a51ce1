# frozen_string_literal: true

require "bunny"

# Topology#teardown (issue 37): core's Connection::teardown through the
# extension, checked from a second client (Bunny) against RabbitMQ.
RSpec.describe "Topology#teardown on RabbitMQ" do
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:queue) { unique("retired") }
  let(:topology) { AceMQ::AMQP::Topology.new.queue(queue) }
  let(:retries) { { max_attempts: 3, initial_delay: 1, max_delay: 10 } }
  let(:names) { [queue, "#{queue}.retry.1s", "#{queue}.retry.2s", "#{queue}.dlq"] }

  before do
    topology.apply(mq)
    # Subscribing declares the ladder: two rungs, and the DLQ beside the queue.
    mq.consume(queue, retries: retries) { AceMQ::AMQP::Ack.accept }.cancel
  end

  after do
    topology.teardown(mq, retries: retries, force: true) unless mq.closed?
    mq.close
    @bunny&.close
  end

  def bunny
    @bunny ||= Bunny.new(AMQP_URL, logger: Logger.new(nil)).tap(&:start)
  end

  def exists?(name)
    ch = bunny.create_channel
    ch.queue(name, passive: true, durable: true)
    true
  rescue Bunny::NotFound
    false
  ensure
    ch&.close if ch&.open?
  end

  it "deletes the queue, its rungs and its DLQ, and a second teardown finds nothing" do
    expect(names.map { |q| exists?(q) }).to all(be(true))
    expect(topology.teardown(mq, retries: retries)).to eq(names)
    expect(names.map { |q| exists?(q) }).to all(be(false))
    expect(topology.teardown(mq, retries: retries)).to eq([])
  end

  it "refuses, deleting nothing, while the DLQ holds a message, and force deletes it" do
    mq.publish({ "order_id" => "T-1" }, to: queue)
    sub = mq.consume(queue, retries: retries) { AceMQ::AMQP::Ack.reject("no such order") }
    eventually(timeout: 5) { mq.queue_counts("#{queue}.dlq")&.fetch(:ready, 0).to_i == 1 }
    sub.cancel

    expect { topology.teardown(mq, retries: retries) }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /#{Regexp.escape(queue)}\.dlq \(1 messages, 0 consumers\).*nothing was deleted/)
    expect(names.map { |q| exists?(q) }).to all(be(true))

    expect(topology.teardown(mq, retries: retries, force: true)).to eq(names)
    expect(names.map { |q| exists?(q) }).to all(be(false))
  end

  it "refuses while a consumer is subscribed" do
    sub = mq.consume(queue, retries: retries) { AceMQ::AMQP::Ack.accept }
    expect { topology.teardown(mq, retries: retries) }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /#{Regexp.escape(queue)} \(0 messages, 1 consumers\)/)
    sub.cancel
    expect(topology.teardown(mq, retries: retries)).to eq(names)
  end
end
