# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"

# docs/events.md against RabbitMQ: what a publish, a retry, a dead letter and
# a duplicate produce, key for key.
RSpec.describe "Events against RabbitMQ" do
  let(:queue) { unique("events") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:events) { Queue.new }
  let(:ladder) { { max_attempts: 2, initial_delay: 0.05, max_delay: 0.05 } }

  before do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    @subscriber = AceMQ.subscribe { |e| events << e if [e[:queue], e[:routing_key]].include?(queue) }
  end

  after do
    @sub&.cancel
    AceMQ.unsubscribe(@subscriber)
    mq.close
  end

  def seen
    @seen ||= []
    @seen << events.pop until events.empty?
    @seen
  end

  def named(name) = seen.select { |e| e.name == name }

  def wait_for(name, count = 1)
    eventually(timeout: 10) { named(name).size >= count }
    named(name)
  end

  PROCESS_KEYS = %i[consumer queue routing_key message_id attempt duration outcome reason error_class].freeze

  it "reports a publish with its destination, message id, confirm latency and outcome" do
    env = mq.publish({ "n" => 1 }, to: queue)
    publish = wait_for("publish.acemq").first
    expect(publish.payload.keys).to match_array(%i[exchange routing_key message_id duration outcome error])
    expect(publish.payload).to include(exchange: "", routing_key: queue, message_id: env.id, outcome: "confirmed", error: nil)
    expect(publish[:duration]).to be_a(Float).and be > 0
  end

  it "reports a retry, then the retried and the accepted settlement, with every key" do
    env = mq.publish({ "n" => 1 }, to: queue)
    runs = 0
    @sub = mq.consume(queue, retries: ladder, name: "EventsSpecConsumer") do
      (runs += 1) == 1 ? AceMQ::AMQP::Ack.retry("gateway timeout") : AceMQ::AMQP::Ack.accept
    end
    processed = wait_for("process.acemq", 2)
    retried, accepted = processed
    expect(retried.payload.keys).to match_array(PROCESS_KEYS)
    expect(retried.payload).to include(consumer: "EventsSpecConsumer", queue: queue, routing_key: queue, message_id: env.id,
                                       attempt: 1, outcome: "retried", reason: "gateway timeout", error_class: nil)
    expect(accepted.payload).to include(attempt: 2, outcome: "accepted", reason: nil)
    expect(accepted[:duration]).to be_a(Float)

    retry_event = wait_for("retry.acemq").first
    expect(retry_event.payload).to eq(queue: queue, message_id: env.id, attempt: 1, rung: "#{queue}.retry.50ms",
                                      reason: "gateway timeout", error_class: nil)
  end

  it "reports a dead letter with its reason and DLQ, and the settlement as dead_lettered" do
    env = mq.publish({ "n" => 1 }, to: queue)
    @sub = mq.consume(queue) { raise AceMQ::AMQP::FatalError, "card declined" }
    dead = wait_for("dead_letter.acemq").first
    expect(dead.payload.keys).to match_array(%i[queue message_id attempt dlq reason error_class])
    expect(dead.payload).to include(queue: queue, message_id: env.id, attempt: 1, dlq: "#{queue}.dlq",
                                    error_class: "AceMQ::AMQP::FatalError")
    expect(dead[:reason]).to include("card declined")
    process = wait_for("process.acemq").first
    expect(process.payload).to include(outcome: "dead_lettered", error_class: "AceMQ::AMQP::FatalError")
  end

  it "reports a duplicate inline, with the message, and its settlement as duplicate" do
    store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new(window: 3600)
    verdicts = Queue.new
    inline = AceMQ.subscribe("idempotency.acemq") { |e| verdicts << [e.payload, Thread.current.name] }
    envelope = AceMQ::AMQP::Envelope.new(type: "payment.requested.v1")
    2.times { mq.publish({ "order_id" => "A-1" }, to: queue, envelope: envelope) }
    @sub = mq.consume(queue, &AceMQ::AMQP::Patterns.idempotent(store) { AceMQ::AMQP::Ack.accept })

    outcomes = wait_for("process.acemq", 2).map { |e| e[:outcome] }
    expect(outcomes).to eq(%w[accepted duplicate])
    payload, thread = verdicts.pop
    expect(payload.keys).to match_array(%i[verdict key error message_id queue message])
    expect(payload).to include(verdict: "duplicate", key: envelope.id, message_id: envelope.id, queue: queue, error: nil)
    expect(payload[:message]).to be_a(AceMQ::AMQP::Message)
    expect(thread).not_to eq("acemq-events") # inline, on the handler's thread
  ensure
    AceMQ.unsubscribe(inline) if inline
  end

  it "keeps Patterns.on working as an alias" do
    store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new(window: 3600)
    heard = Queue.new
    listener = AceMQ::AMQP::Patterns.on(:duplicate) { |event, detail| heard << [event, detail[:key]] }
    envelope = AceMQ::AMQP::Envelope.new
    2.times { mq.publish({ "n" => 1 }, to: queue, envelope: envelope) }
    @sub = mq.consume(queue, &AceMQ::AMQP::Patterns.idempotent(store) { AceMQ::AMQP::Ack.accept })
    expect(eventually(timeout: 10) { heard.pop(true) rescue nil }).to eq([:duplicate, envelope.id]) # rubocop:disable Style/RescueModifier
  ensure
    AceMQ::AMQP::Patterns.off(listener) if listener
  end

  it "changes nothing when a subscriber raises" do
    warned = Queue.new
    allow(AceMQ::Events).to receive(:warn) { |line| warned << line }
    raising = AceMQ.subscribe { raise "a subscriber that raises" }
    begin
      mq.publish({ "n" => 1 }, to: queue)
      @sub = mq.consume(queue) { AceMQ::AMQP::Ack.accept }
      eventually(timeout: 10) { @sub.stats[:accepted] == 1 }
      expect(wait_for("process.acemq").first[:outcome]).to eq("accepted")
      expect(warned.pop).to match(/subscriber raised RuntimeError: a subscriber that raises/)
    ensure
      AceMQ.unsubscribe(raising)
    end
  end

  it "stops asking the engine for events once nobody subscribes" do
    AceMQ.unsubscribe(@subscriber)
    expect(AceMQ::Events.__send__(:_listening?)).to be(false)
    @subscriber = AceMQ.subscribe("runner") { nil }
    expect(AceMQ::Events.__send__(:_listening?)).to be(true)
  end
end
