# frozen_string_literal: true

RSpec.describe "memory:// transport" do
  let(:url) { memory_url }

  it_behaves_like "a transport"

  # What settles a delivery lives in its NativeDelivery, and the engine
  # alone times it: settled once, still settleable after an Ack that could
  # not be read, counted in flight by the engine, overdue once its deadline
  # has settled it.
  it "settles a delivery once, keeps it after an unreadable Ack, and says when its deadline settled it" do
    mq = AceMQ::AMQP::Connection.open(url)
    q = unique("owner")
    AceMQ::AMQP::Topology.new.queue(q).apply(mq)
    native = mq.send(:_consumer, q, { timeout: 0.3 })
    2.times { |n| mq.publish({ "n" => n }, to: q) }
    d = eventually { native._next(0.5) }
    expect(native._inflight).to eq(1)
    unreadable = Class.new(AceMQ::AMQP::Ack) { def reason = raise("unreadable") }.send(:new, :retry, "later")
    expect { native._settle(d, unreadable, nil) }.to raise_error(RuntimeError, "unreadable")
    expect(native._inflight).to eq(1)
    native._settle(d, AceMQ::AMQP::Ack.accept, nil)
    expect(native._inflight).to eq(0)
    expect { native._settle(d, AceMQ::AMQP::Ack.accept, nil) }
      .to raise_error(ArgumentError, /delivery #{d.tag} is not in flight on this consumer \(settled twice\?\)/)
    late = eventually { native._next(0.5) }
    expect(late._overdue?).to be(false)
    eventually(timeout: 5) { late._overdue? }
    expect(native._inflight).to eq(0)
    native._settle(late, AceMQ::AMQP::Ack.accept, nil) # its handler returned late: discarded
    expect(native._stats).to include(accepted: 1, timed_out: 1, abandoned: 1)
  ensure
    native&._close
    mq&.close
  end

  # _next, _settle and _payload read their receiver and delivery with a
  # check of their own (ext/src/convert.rs, Typed); anything else is
  # refused as magnus refuses it, and the delivery in hand is unharmed.
  it "refuses what is not a delivery or a consumer with a TypeError, and settles the delivery after" do
    mq = AceMQ::AMQP::Connection.open(url)
    q = unique("typed")
    AceMQ::AMQP::Topology.new.queue(q).apply(mq)
    native = mq.send(:_consumer, q, {})
    mq.publish({ "n" => 1 }, to: q)
    d = eventually { native._next(0.5) }
    [Object.new, "delivery", nil, 7, native, AceMQ::AMQP::Ack.accept].each do |wrong|
      expect { native._settle(wrong, AceMQ::AMQP::Ack.accept, nil) }
        .to raise_error(TypeError, /AceMQ::AMQP::Message::Consumed/)
    end
    settle = AceMQ::AMQP::NativeConsumer.instance_method(:_settle)
    expect { settle.bind_call(Object.new, d, AceMQ::AMQP::Ack.accept) }.to raise_error(TypeError)
    payload = AceMQ::AMQP::NativeDelivery.instance_method(:_payload)
    expect { payload.bind_call(native) }.to raise_error(TypeError)
    expect(payload.bind_call(d)).to eq("n" => 1)
    expect(native._inflight).to eq(1)
    native._settle(d, AceMQ::AMQP::Ack.accept, nil)
    expect(native._inflight).to eq(0)
  ensure
    native&._close
    mq&.close
  end

  it "walks a 5-minute ladder in no time with advance_clock" do
    mq = AceMQ::AMQP::Connection.open(url)
    q = unique("ladder")
    AceMQ::AMQP::Topology.new.queue(q).apply(mq)
    seen = Queue.new
    sub = mq.consume(q, retries: { max_attempts: 3, initial_delay: 300, max_delay: 300 }) do |m|
      seen << m.envelope.attempt
      AceMQ::AMQP::Ack.retry("later")
    end
    mq.publish({}, to: q)
    rung = "#{q}.retry.300s"
    expect(eventually { seen.pop(true) rescue nil }).to eq(1)
    # The copy to the rung is made in the background: wait for it to land.
    eventually { mq.queue_depth(rung) == { ready: 1, unacked: 0 } }
    # Real time runs too (slowly, under GC.stress): leave it 30 s of slack.
    mq.advance_clock(270)
    expect(mq.queue_depth(rung)[:ready]).to eq(1)
    mq.advance_clock(30)
    expect(eventually { seen.pop(true) rescue nil }).to eq(2)
    eventually { mq.queue_depth(rung)[:ready] == 1 }
    mq.advance_clock(300)
    expect(eventually { seen.pop(true) rescue nil }).to eq(3)
    eventually { mq.queue_depth("#{q}.dlq")[:ready] == 1 }
    expect(sub.stats).to include(accepted: 0, retried: 2, dead_lettered: 1, waited: 0, timed_out: 0)
    sub.cancel
    mq.close
  end

  it "dead-letters a body that is not JSON and hands the handler only what it can read" do
    mq = AceMQ::AMQP::Connection.open(url)
    q = unique("garbage")
    AceMQ::AMQP::Topology.new.queue(q).apply(mq)
    # Bypass publish's JSON encoding: a foreign client's body.
    foreign = AceMQ::AMQP::Outgoing._build(mq, "<xml/>", { to: q, envelope: AceMQ::AMQP::Envelope.new(id: "foreign-1", timestamp: 0) })
    mq.__send__(:_publish, foreign)
    mq.publish({ "ok" => true }, to: q)
    seen = Queue.new
    sub = mq.consume(q) { |m| seen << m.payload; AceMQ::AMQP::Ack.accept }
    expect(eventually { seen.pop(true) rescue nil }).to eq("ok" => true)
    eventually { mq.queue_depth("#{q}.dlq")[:ready] == 1 }
    expect(sub.stats[:dead_lettered]).to eq(1)
    sub.cancel
    mq.close
  end

  it "shares one broker between connections to the same memory:// name" do
    a = AceMQ::AMQP::Connection.open(url)
    b = AceMQ::AMQP::Connection.open(url)
    q = unique("shared")
    AceMQ::AMQP::Topology.new.queue(q).apply(a)
    b.publish({ "from" => "b" }, to: q)
    expect(a.queue_depth(q)).to eq(ready: 1, unacked: 0)
    expect(AceMQ::AMQP::Connection.open(memory_url).queue_depth(q)).to be_nil
  end

  it "shows every field of a dead letter it peeks at, leaving it in place" do
    mq = AceMQ::AMQP::Connection.open(url)
    q = unique("peek")
    AceMQ::AMQP::Topology.new.queue(q).apply(mq)
    sent = mq.publish({ "order_id" => "A-1" }, to: q, type: "order.placed.v1")
    sub = mq.consume(q) { |_m| raise AceMQ::AMQP::FatalError, "no such order" }
    before = Time.now.to_i
    letter = eventually { mq.peek_dead_letters(q, limit: 1).first }
    sub.cancel
    expect(letter).to have_attributes(id: sent.id, type: "order.placed.v1", attempt: 1,
                                      error_class: "AceMQ::AMQP::FatalError", body: '{"order_id":"A-1"}')
    expect(letter.reason).to include("no such order")
    expect(letter.failed_at).to be_a(Time).and(be_within(5).of(Time.at(before)))
    expect(letter.body.encoding).to eq(Encoding::BINARY)
    expect(mq.peek_dead_letters(q, limit: 5).map(&:id)).to eq([sent.id])
    mq.close
  end

  it "refuses advance_clock on RabbitMQ-only calls with a clear error" do
    mq = AceMQ::AMQP::Connection.open(url)
    expect { mq.advance_clock(-1) }.to raise_error(AceMQ::AMQP::ConfigurationError, /seconds/)
  end
end

RSpec.describe "Connection.open" do
  it "refuses an unknown scheme" do
    expect { AceMQ::AMQP::Connection.open("kafka://localhost:9092") }
      .to raise_error(AceMQ::AMQP::InvalidURL, /unknown URL scheme "kafka".*amqp:\/\//)
  end

  it "refuses a URL that is not a string" do
    expect { AceMQ::AMQP::Connection.open(nil) }.to raise_error(AceMQ::AMQP::ConfigurationError, /URL string/)
  end

  it "fails fast when nothing listens, within connect_timeout" do
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    expect { AceMQ::AMQP::Connection.open("amqp://guest:guest@127.0.0.1:1", connect_timeout: 2) }
      .to raise_error(AceMQ::AMQP::ConnectionFailed, /127\.0\.0\.1:1/)
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 4
  end
end

RSpec.describe AceMQ::AMQP::Ack do
  it "answers the predicates RSpec's be_accept uses" do
    expect(described_class.accept).to be_accept
    expect(described_class.retry("x")).to be_retry
    expect(described_class.reject("x", error: AceMQ::AMQP::FatalError)).to be_reject
    expect(described_class.reject("x", error: AceMQ::AMQP::FatalError).error_class).to eq("AceMQ::AMQP::FatalError")
    expect(described_class.accept).not_to be_retry
    expect { described_class.new(:accept) }.to raise_error(NoMethodError)
  end
end

RSpec.describe AceMQ::AMQP::Message do
  it "is built by hand for a handler spec, as the seed's RSpec example does" do
    message = AceMQ::AMQP::Message.new(
      payload: { "order_id" => "A-1", "amount_cents" => 1299 },
      envelope: AceMQ::AMQP::Envelope.new(id: "m-1", type: "payment.due.v1")
    )
    expect(message.envelope.id).to eq("m-1")
    expect(message.envelope.type).to eq("payment.due.v1")
    expect(message.payload["order_id"]).to eq("A-1")
    expect(message.envelope.attempt).to eq(1)
  end

  it "gives every new envelope a fresh UUIDv7" do
    ids = Array.new(100) { AceMQ::AMQP::Envelope.new.id }
    expect(ids.uniq.size).to eq(100)
    expect(ids).to all(match(/\A\h{8}-\h{4}-7/))
  end
end
