# frozen_string_literal: true

require "bunny"

# Quorum queues through the whole ladder, on RabbitMQ 3.10: the queue, its
# DLQ and its rungs are quorum queues; the rungs and the main queue
# dead-letter at least once; the broker's own delivery limit lands a message
# in {queue}.dlq with its x-death reason.
RSpec.describe "quorum queues" do
  let(:queue) { unique("quorum") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }

  before(:all) { @bunny = Bunny.new(AMQP_URL, logger: Logger.new(nil)).tap(&:start) }
  after(:all) { @bunny.close }
  after { mq.close }

  # name => [type, arguments text] as the broker reports them.
  def declared(prefix)
    `rabbitmqctl list_queues -q --no-table-headers name type arguments 2>/dev/null`.lines
      .map { |l| l.chomp.split("\t", 3) }.select { |n, _, _| n.start_with?(prefix) }
      .to_h { |n, t, a| [n, [t, a]] }
  end

  it "declares the queue, its DLQ and its rungs as quorum queues that dead-letter at least once" do
    AceMQ::AMQP::Topology.new.queue(queue, type: :quorum).apply(mq)
    sub = mq.consume(queue, retries: { max_attempts: 3, initial_delay: 1, max_delay: 2 }) { AceMQ::AMQP::Ack.accept }
    sub.cancel
    q = declared(queue)
    expect(q.keys).to contain_exactly(queue, "#{queue}.dlq", "#{queue}.retry.1s", "#{queue}.retry.2s")
    expect(q.values.map(&:first)).to all(eq("quorum"))
    main = q[queue].last
    expect(main).to include("at-least-once", "reject-publish", "x-delivery-limit", "#{queue}.dlq")
    expect(q["#{queue}.retry.1s"].last).to include("at-least-once", "reject-publish", "x-message-ttl")
    expect(q["#{queue}.dlq"].last).not_to include("x-dead-letter-exchange")
  end

  it "climbs the ladder on quorum rungs and dead-letters with the reason" do
    AceMQ::AMQP::Topology.new.queue(queue, type: :quorum).apply(mq)
    attempts = Queue.new
    sub = mq.consume(queue, retries: { max_attempts: 2, initial_delay: 0.2, max_delay: 0.2 }) do |m|
      attempts << [m.payload["n"], m.attempt]
      m.payload["n"] == 1 && m.attempt == 1 ? AceMQ::AMQP::Ack.retry("once more") : AceMQ::AMQP::Ack.accept
    end
    mq.publish({ "n" => 1 }, to: queue)
    eventually(timeout: 10) { sub.stats[:accepted] == 1 }
    expect(Array.new(attempts.size) { attempts.pop }).to eq([[1, 1], [1, 2]])
    expect(sub.stats[:retried]).to eq(1)
    sub.cancel

    failing = mq.consume(queue, retries: { max_attempts: 2, initial_delay: 0.2, max_delay: 0.2 }) do
      AceMQ::AMQP::Ack.retry("gateway down")
    end
    mq.publish({ "n" => 2 }, to: queue)
    eventually(timeout: 10) { failing.stats[:dead_lettered] == 1 }
    failing.cancel
    letter = mq.peek_dead_letters(queue, limit: 1).first
    expect(letter).to include(attempt: 2, reason: "retries exhausted after 2 attempts: gateway down")
  end

  it "lands a message past the broker's delivery limit in the DLQ, with the broker's reason readable" do
    AceMQ::AMQP::Topology.new.queue(queue, type: :quorum, arguments: { "x-delivery-limit" => 1 }).apply(mq)
    mq.publish({ "n" => 1 }, to: queue)
    ch = @bunny.create_channel
    # Given back unsettled, as a consumer that dies holding it would: the
    # broker counts each return, and past the limit dead-letters it itself.
    2.times do
      delivery, = eventually { ch.basic_get(queue, manual_ack: true).then { |d, p, b| d && [d, p, b] } }
      ch.nack(delivery.delivery_tag, false, true)
    end
    letter = eventually(timeout: 10) { mq.peek_dead_letters(queue, limit: 1).first }
    expect(letter[:reason]).to match(/dead-lettered by the broker: delivery_limit on #{queue}/)
    got = Queue.new
    sub = mq.consume("#{queue}.dlq") { |m| got << m; AceMQ::AMQP::Ack.accept }
    m = eventually { got.pop(true) rescue nil }
    expect(m.headers["x-death"].first).to include("reason" => "delivery_limit", "queue" => queue)
    expect(m.payload).to eq("n" => 1)
    sub.cancel
    ch.close
  end

  it "refuses to redeclare a classic queue as quorum, naming the argument" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    expect { AceMQ::AMQP::Topology.new.queue(queue, type: :quorum).apply(mq) }
      .to raise_error(AceMQ::AMQP::PreconditionFailed, /x-queue-type|x-dead-letter|x-delivery-limit/)
  end

  it "takes the type from the consumer class in the Rails DSL" do
    require "acemq/rails"
    klass = Class.new(AceMQ::Rails::Consumer) { def call(_m) = accept }
    klass.queue(queue, type: :quorum)
    klass.topology.apply(mq)
    klass.subscribe(mq).cancel
    expect(declared(queue).values.map(&:first).uniq).to eq(["quorum"])
  end
end
