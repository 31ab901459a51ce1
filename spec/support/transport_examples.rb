# frozen_string_literal: true

# The transport's observable behaviour. spec/unit runs these on memory://,
# spec/integration on RabbitMQ: the same examples, so the two cannot drift.
RSpec.shared_examples "a transport" do
  include AceMQ::AMQP

  let(:queue) { unique("q") }
  let(:received) { Queue.new }
  let(:fast_ladder) { { max_attempts: 3, initial_delay: 0.2, max_delay: 0.4 } }

  before do
    @mq = AceMQ::AMQP::Connection.open(url)
    @subs = []
    AceMQ::AMQP::Topology.new.queue(queue).apply(@mq)
  end

  after do
    @subs.each(&:cancel)
    @mq.close
  end

  def consume(name = queue, **opts, &block)
    sub = @mq.consume(name, **opts, &block)
    @subs << sub
    sub
  end

  def take(timeout: 10)
    deadline = Time.now + timeout
    loop do
      return received.pop(true)
    rescue ThreadError
      raise "nothing received within #{timeout}s" if Time.now > deadline

      sleep 0.01
    end
  end

  # Wait for the rungs of a short ladder: advance the clock on memory://,
  # let RabbitMQ's TTL run out on amqp://.
  def let_the_ladder_run
    @mq.memory? ? @mq.advance_clock(1) : nil
  end

  it "runs Tutorial 3 Step 1: the same envelope twice is charged twice" do
    charged = []
    consume do |message|
      charged << message.payload["order_id"]
      AceMQ::AMQP::Ack.accept
    end
    envelope = AceMQ::AMQP::Envelope.new(type: "payment.requested.v1")
    2.times { @mq.publish({ "order_id" => "A-1", "amount" => 4200 }, to: queue, envelope: envelope) }
    eventually { charged.size == 2 }
    expect(charged).to eq(%w[A-1 A-1])
  end

  it "carries the envelope: id, type, origin, timestamp, attempt, headers" do
    consume { |m| received << m; AceMQ::AMQP::Ack.accept }
    before = Time.now.to_i
    env = @mq.publish({ "n" => 1 }, to: queue, type: "thing.happened.v1", headers: { "tenant" => "acme" })
    m = take
    expect(m.payload).to eq("n" => 1)
    expect(m.envelope.id).to eq(env.id)
    expect(m.envelope.id).to match(/\A\h{8}-\h{4}-7\h{3}-\h{4}-\h{12}\z/) # a UUIDv7
    expect(m.envelope.type).to eq("thing.happened.v1")
    expect(m.envelope.origin).to eq(@mq.origin)
    expect(m.envelope.timestamp).to be_between(before, Time.now.to_i)
    expect(m.envelope.attempt).to eq(1)
    expect(m.envelope.headers).to include("tenant" => "acme")
    expect(m.delivery.queue).to eq(queue)
    expect(m.delivery).not_to be_redelivered
  end

  it "routes through topic exchanges and refuses what nothing is bound to" do
    ex = unique("events")
    AceMQ::AMQP::Topology.new.exchange(ex, type: :topic).queue(queue).bind(queue, to: ex, routing_key: "order.*").apply(@mq)
    consume { |m| received << m; AceMQ::AMQP::Ack.accept }
    @mq.publish({ "k" => "placed" }, to: "order.placed", exchange: ex)
    expect { @mq.publish({ "k" => "paid" }, to: "invoice.paid", exchange: ex) }.to raise_error(AceMQ::AMQP::Unroutable, /nothing is bound/)
    m = take
    expect(m.payload).to eq("k" => "placed")
    expect(m.delivery.exchange).to eq(ex)
    expect(m.delivery.routing_key).to eq("order.placed")
  end

  it "publishes a batch with the confirms awaited together" do
    consume { |m| received << m.payload["n"]; AceMQ::AMQP::Ack.accept }
    count = @mq.batch { |b| 50.times { |n| b.publish({ "n" => n }, to: queue) } }
    expect(count).to eq(50)
    expect(Array.new(50) { take }.sort).to eq((0...50).to_a)
  end

  it "sends nothing for an empty batch, held or streamed, and says so" do
    expect(@mq.batch { |_b| nil }).to eq(0)
    expect(@mq.batch(stream: true) { |_b| nil }).to eq(0)
    @mq.publish({ "n" => 1 }, to: queue)
    consume { |m| received << m.payload["n"]; AceMQ::AMQP::Ack.accept }
    expect(take).to eq(1)
    sleep 0.1
    expect(received.size).to eq(0) # the one message, and nothing from the empty batches
  end

  it "streams a batch: sent in order while the block builds, confirms awaited together" do
    consume { |m| received << m.payload["n"]; AceMQ::AMQP::Ack.accept }
    n = AceMQ::AMQP::NativeBatch::CHUNK * 3 + 7 # several chunks and a tail
    count = @mq.batch(stream: true) { |b| n.times { |i| b.publish({ "n" => i }, to: queue) } }
    expect(count).to eq(n)
    # One consumer thread on one queue: the order they were published in.
    expect(Array.new(n) { take }).to eq((0...n).to_a)
  end

  it "streams a batch whose block raises: what it published went out, and its exception is raised" do
    consume { |m| received << m.payload["n"]; AceMQ::AMQP::Ack.accept }
    n = AceMQ::AMQP::NativeBatch::CHUNK + 5 # one chunk handed over, the tail not yet
    expect do
      @mq.batch(stream: true) do |b|
        n.times { |i| b.publish({ "n" => i }, to: queue) }
        raise ArgumentError, "the block's own failure"
      end
    end.to raise_error(ArgumentError, "the block's own failure")
    expect(Array.new(n) { take }).to eq((0...n).to_a)
    # A held batch whose block raises sends nothing.
    expect { @mq.batch { |b| b.publish({ "n" => -1 }, to: queue); raise "no" } }.to raise_error(RuntimeError, "no")
    @mq.publish({ "n" => n }, to: queue)
    expect(take).to eq(n)
  end

  it "streams a batch with one unroutable message among good ones: the rest go, the failure is raised after" do
    consume { |m| received << m.payload["n"]; AceMQ::AMQP::Ack.accept }
    nowhere = unique("noqueue")
    expect do
      @mq.batch(stream: true) do |b|
        b.publish({ "n" => 0 }, to: queue)
        b.publish({ "n" => "lost" }, to: nowhere)
        b.publish({ "n" => 1 }, to: queue)
      end
    end.to raise_error(AceMQ::AMQP::Unroutable)
    expect([take, take]).to eq([0, 1])
  end

  it "runs handlers on several threads with concurrency:" do
    threads = Queue.new
    consume(concurrency: 4) do |m|
      threads << Thread.current.name
      sleep 0.05
      received << m.payload["n"]
      AceMQ::AMQP::Ack.accept
    end
    20.times { |n| @mq.publish({ "n" => n }, to: queue) }
    expect(Array.new(20) { take }.sort).to eq((0...20).to_a)
    expect(Array.new(threads.size) { threads.pop }.uniq.size).to be > 1
  end

  it "retries up the ladder with the same id and then dead-letters with the reason" do
    attempts = []
    consume(retries: fast_ladder) do |m|
      attempts << [m.envelope.id, m.envelope.attempt]
      received << m
      AceMQ::AMQP::Ack.retry("payment gateway down")
    end
    env = @mq.publish({ "x" => 1 }, to: queue)
    take
    let_the_ladder_run
    take
    let_the_ladder_run
    take
    expect(attempts).to eq([[env.id, 1], [env.id, 2], [env.id, 3]])
    dead = Queue.new
    consume("#{queue}.dlq") { |m| dead << m; AceMQ::AMQP::Ack.accept }
    m = eventually { dead.pop(true) rescue nil }
    expect(m.envelope.id).to eq(env.id)
    expect(m.headers["x-acemq-reason"]).to include("retries exhausted", "payment gateway down")
    expect(m.headers["x-acemq-original-routing-key"]).to eq(queue)
    expect(m.envelope.attempt).to eq(3)
  end

  it "treats a raised error as a retry and a FatalError as a reject" do
    consume(retries: fast_ladder) do |m|
      received << m
      raise ArgumentError, "transient" if m.envelope.attempt == 1

      raise AceMQ::AMQP::FatalError, "this order does not exist"
    end
    @mq.publish({ "x" => 1 }, to: queue)
    first = take
    expect(first.envelope.attempt).to eq(1)
    let_the_ladder_run
    second = take
    expect(second.envelope.attempt).to eq(2)
    expect(second.headers["x-acemq-error-class"]).to eq("ArgumentError")
    dead = Queue.new
    consume("#{queue}.dlq") { |m| dead << m; AceMQ::AMQP::Ack.accept }
    m = eventually { dead.pop(true) rescue nil }
    expect(m.headers["x-acemq-error-class"]).to eq("AceMQ::AMQP::FatalError")
    expect(m.headers["x-acemq-reason"]).to include("this order does not exist")
  end

  it "rejects a handler result that is not an Ack, naming it" do
    consume { |_m| :ok }
    @mq.publish({ "x" => 1 }, to: queue)
    dead = Queue.new
    consume("#{queue}.dlq") { |m| dead << m; AceMQ::AMQP::Ack.accept }
    m = eventually { dead.pop(true) rescue nil }
    expect(m.headers["x-acemq-reason"]).to include(":ok (Symbol)", "not an Ack")
  end

  it "does not hold the GVL while waiting for deliveries" do
    consume { |_m| AceMQ::AMQP::Ack.accept }
    counter = 0
    spinner = Thread.new { loop { counter += 1 } }
    sleep 0.3
    spinner.kill
    # A consumer thread holding the GVL while idle would starve the spinner.
    expect(counter).to be > 100_000
  end

  it "refuses bad input with its own error class and keeps working" do
    expect { @mq.publish({ "x" => 1 }, to: "k", exchange: unique("missing")) }.to raise_error(AceMQ::AMQP::NotFound) { |e| expect(e.reply_code).to eq(404) }
    expect { @mq.consume(unique("missing")) { AceMQ::AMQP::Ack.accept } }.to raise_error(AceMQ::AMQP::NotFound, /no queue|NOT_FOUND/)
    expect { @mq.publish({ "x" => 1 }, to: unique("noqueue")) }.to raise_error(AceMQ::AMQP::Unroutable)
    expect { @mq.publish({ "x" => Float::NAN }, to: queue) }.to raise_error(AceMQ::AMQP::EncodingError, /JSON/)
    expect { @mq.consume(queue, retries: { max_attempts: 0 }) { AceMQ::AMQP::Ack.accept } }.to raise_error(ArgumentError, /max_attempts/)
    expect { @mq.consume(queue, retries: { max_attempts: -3 }) { AceMQ::AMQP::Ack.accept } }.to raise_error(AceMQ::AMQP::ConfigurationError, /at least 1/)
    expect { @mq.consume(queue, retries: { initial_delay: 400 }) { AceMQ::AMQP::Ack.accept } }.to raise_error(AceMQ::AMQP::ConfigurationError, /max_delay/)
    expect { @mq.consume(queue, retries: { max_tries: 3 }) { AceMQ::AMQP::Ack.accept } }.to raise_error(AceMQ::AMQP::ConfigurationError, /max_tries/)
    expect { @mq.consume(queue, retries: { initial_delay: -1 }) { AceMQ::AMQP::Ack.accept } }.to raise_error(AceMQ::AMQP::ConfigurationError, /initial_delay/)
    expect { @mq.consume(queue, prefetch: 0) { AceMQ::AMQP::Ack.accept } }.to raise_error(AceMQ::AMQP::ConfigurationError, /prefetch/)
    expect { @mq.consume(queue) }.to raise_error(AceMQ::AMQP::ConfigurationError, /block/)
    # Still working after all of that.
    consume { |m| received << m; AceMQ::AMQP::Ack.accept }
    @mq.publish({ "still" => "working" }, to: queue)
    expect(take.payload).to eq("still" => "working")
  end

  it "says which argument differs when a queue is redeclared with others" do
    name = unique("conflict")
    AceMQ::AMQP::Topology.new.queue(name, arguments: { "x-max-length" => 10 }).apply(@mq)
    expect { AceMQ::AMQP::Topology.new.queue(name, arguments: { "x-max-length" => 20 }).apply(@mq) }
      .to raise_error(AceMQ::AMQP::PreconditionFailed, /x-max-length/) { |e| expect(e.reply_code).to eq(406) }
    expect { AceMQ::AMQP::Topology.new.queue(name, arguments: { "x-max-length" => 10 }).apply(@mq) }.not_to raise_error
  end

  it "gives an unsettled message back when its consumer goes away" do
    gate = Queue.new
    first = consume { |m| received << m; gate.pop; AceMQ::AMQP::Ack.accept }
    @mq.publish({ "x" => 1 }, to: queue)
    take
    canceller = Thread.new { first.cancel }
    gate << :go
    canceller.join
    consume { |m| received << m; AceMQ::AMQP::Ack.accept }
    @mq.publish({ "x" => 2 }, to: queue)
    expect(take.payload).to eq("x" => 2) # the first was accepted before the cancel finished
  end

  # Ready messages on the queue: the broker's own count on RabbitMQ.
  def ready_on(name)
    return @mq.queue_depth(name)[:ready] if @mq.memory?

    require "bunny"
    bunny = Bunny.new(AMQP_URL).tap(&:start)
    bunny.create_channel.queue(name, passive: true).message_count
  ensure
    bunny&.close
  end

  it "on cancel lets running handlers finish and gives back, marked redelivered, what none had started" do
    20.times { |i| @mq.publish({ "n" => i }, to: queue) }
    gate = Queue.new
    started = Queue.new
    first = @mq.consume(queue, concurrency: 2, prefetch: 20) do |m|
      started << m.payload["n"]
      gate.pop
      AceMQ::AMQP::Ack.accept
    end
    eventually { started.size == 2 }
    eventually { ready_on(queue).zero? } # all 20 are with the consumer: 2 running, 18 buffered
    canceller = Thread.new { first.cancel }
    eventually { first.cancelled? }
    20.times { gate << :go } # enough for all: a transport that ran the buffered ones would show it
    canceller.join
    expect(started.size).to eq(2) # only the two in flight ran
    expect(first.stats[:accepted]).to eq(2)

    consume { |m| received << m; AceMQ::AMQP::Ack.accept }
    back = Array.new(18) { take }
    expect(back.map { |m| m.payload["n"] }.sort).to eq((0...20).to_a - Array.new(2) { started.pop })
    expect(back).to all(satisfy { |m| m.delivery.redelivered? })
  end

  it "refuses names past AMQP's 255 bytes with its own error, on every path, and keeps working" do
    long = "k" * 256
    refused = AceMQ::AMQP::ConfigurationError
    expect { @mq.publish({}, to: long) }.to raise_error(refused, /routing key is 256 bytes/)
    expect { @mq.publish({}, to: queue, type: long) }.to raise_error(refused, /type is 256 bytes/)
    expect { @mq.publish({}, to: queue, envelope: AceMQ::AMQP::Envelope.new(id: long)) }.to raise_error(refused, /message id/)
    expect { @mq.publish({}, to: queue, headers: { long => 1 }) }.to raise_error(refused, /header name/)
    expect { AceMQ::AMQP::Topology.new.queue("q" * 252).apply(@mq) }.to raise_error(refused, /dead-letter queue/)
    expect { AceMQ::AMQP::Topology.new.exchange(long).apply(@mq) }.to raise_error(refused, /exchange name/)
    expect { @mq.consume("q" * 250) { AceMQ::AMQP::Ack.accept } }.to raise_error(refused, /retry rung|dead-letter/)
    expect { @mq.publish({}, to: queue, headers: { "big" => "x" * 200_000 }) }.to raise_error(refused, /one AMQP frame/)
    expect { AceMQ::AMQP::Connection.open(url, origin: long) }.to raise_error(refused, /origin/)
    @mq.publish({ "after" => true }, to: queue) # the connection is fine
    consume { |m| received << m; AceMQ::AMQP::Ack.accept }
    expect(take.payload).to eq("after" => true)
  end

  it "dead-letters a message whose reason is larger than a frame, with the reason cut, and the queue moves on" do
    calls = Hash.new(0)
    sub = consume(retries: { max_attempts: 1 }) do |m|
      calls[m.payload["n"]] += 1
      m.payload["n"] == 2 ? AceMQ::AMQP::Ack.reject("x" * 300_000) : (received << m; AceMQ::AMQP::Ack.accept)
    end
    (1..3).each { |n| @mq.publish({ "n" => n }, to: queue) }
    expect(Array.new(2) { take.payload["n"] }.sort).to eq([1, 3])
    eventually { sub.stats[:dead_lettered] == 1 }
    letter = @mq.peek_dead_letters(queue, limit: 1).first
    expect(letter.reason.bytesize).to be <= 4096
    expect(letter.reason).to end_with("[truncated from 300000 bytes]")
    expect(calls[2]).to eq(1) # once: no redelivery loop
  end

  it "hands numbers over exactly: integers past 64 bits, floats with every digit" do
    payload = { "big" => 2**70, "neg" => -(2**65), "max" => 2**64 - 1, "f" => 0.1 + 0.2, "small" => 1.5, "n" => 7,
                "s" => "12345678901234567890" }
    consume { |m| received << m; AceMQ::AMQP::Ack.accept }
    @mq.publish(payload, to: queue)
    got = take.payload
    expect(got).to eq(payload)
    expect(got["big"]).to be_an(Integer)
    expect(got["f"]).to eq(0.30000000000000004)
  end

  it "returns the envelope the message went out with, not the one passed in" do
    consume { |m| received << m; AceMQ::AMQP::Ack.accept }
    given = AceMQ::AMQP::Envelope.new(type: "a.v1", attempt: 3, headers: { "kept" => 1, "over" => "old" })
    sent = @mq.publish({ "n" => 1 }, to: queue, envelope: given, type: "b.v1", headers: { over: "new" })
    expect(sent).not_to equal(given)
    expect(sent.id).to eq(given.id)
    expect(sent.attempt).to eq(1) # a publish is a first delivery, whatever envelope it reuses
    expect(sent.origin).to eq(@mq.origin)
    expect(sent.type).to eq("b.v1")
    expect(sent.headers).to eq("kept" => 1, "over" => "new")
    got = take.envelope
    expect([got.id, got.type, got.attempt, got.origin, got.timestamp]).to eq([sent.id, sent.type, 1, sent.origin, sent.timestamp])
    expect(got.headers).to include(sent.headers)
    batch_env = nil
    @mq.batch { |b| batch_env = b.publish({ "n" => 2 }, to: queue, envelope: given) }
    expect([batch_env.id, batch_env.attempt, batch_env.origin, batch_env.type]).to eq([given.id, 1, @mq.origin, "a.v1"])
  end

  it "refuses a replay or peek limit below 1 with the engine's ConfigurationError" do
    [0, -1].each do |limit|
      expect { @mq.replay_dead_letters(queue, limit: limit) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /replay limit must be at least 1/)
      expect { @mq.peek_dead_letters(queue, limit: limit) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /peek limit must be at least 1/)
    end
    expect { @mq.replay_dead_letters(queue, limit: "many") }.to raise_error(AceMQ::AMQP::ConfigurationError, /whole number/)
    expect(@mq.replay_dead_letters(queue, limit: nil).to_h).to eq(replayed: 0, skipped: 0)
  end
end
