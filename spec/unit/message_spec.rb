# frozen_string_literal: true

# A consumed message reads the engine's delivery object (NativeDelivery)
# field by field; one built by hand holds what it was given. Both answer the
# same readers.
RSpec.describe AceMQ::AMQP::Message do
  let(:mq) { AceMQ::AMQP::Connection.open(memory_url) }
  let(:queue) { unique("message") }

  # GC.compact runs in a forked child, so this process's heap is never
  # compacted: a C extension loaded by another spec may keep a Ruby object
  # in a C global it never told the GC about. Debian 12's mysql2 0.5.3 does
  # (its Mysql2::Error class; fixed in 0.5.4): after a compaction here, the
  # MySQL specs that ran later in the same process raised
  # "undefined method `new_with_args' for \"\\a\":String".
  def in_child
    rd, wr = IO.pipe
    pid = fork do
      rd.close
      begin
        yield
        wr.write("ok")
      rescue Exception => e # rubocop:disable Lint/RescueException
        wr.write("#{e.class}: #{e.message}\n#{e.backtrace&.first(5)&.join("\n")}")
      end
      wr.close
      exit!(0)
    end
    wr.close
    said = rd.read
    Process.wait(pid)
    raise RSpec::Expectations::ExpectationNotMetError, "in the child: #{said}" unless said == "ok"
  end

  def consumed(payload, envelope)
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    mq.publish(payload, to: queue, envelope: envelope)
    got = Queue.new
    sub = mq.consume(queue) { |m| got << m; AceMQ::AMQP::Ack.accept }
    message = got.pop
    eventually { sub.stats[:accepted] == 1 }
    sub.cancel
    message
  end

  it "reads every field of a delivery, after it was settled too, and builds each once" do
    envelope = AceMQ::AMQP::Envelope.new(type: "order.placed.v1", headers: { "tenant" => "acme" }, timestamp: 1_700_000_000)
    m = consumed({ "order_id" => "A-1", "n" => [1, 2.5, nil, true], "big" => 2**70 }, envelope)
    expect(m.native_delivery).to be_a(AceMQ::AMQP::NativeDelivery)
    expect(m.payload).to eq("order_id" => "A-1", "n" => [1, 2.5, nil, true], "big" => 2**70)
    expect(m.payload).to equal(m.payload) # built on the first read, kept
    expect(m.payload.keys).to all(be_frozen)
    expect([m.id, m.type, m.attempt, m.headers]).to eq([envelope.id, "order.placed.v1", 1, { "tenant" => "acme" }])
    expect(m.envelope).to eq(AceMQ::AMQP::Envelope.new(id: envelope.id, type: "order.placed.v1", origin: mq.origin,
                                                       timestamp: 1_700_000_000, headers: { "tenant" => "acme" }))
    expect(m.envelope).to equal(m.envelope)
    expect(m.delivery.to_h.except(:properties)).to eq(queue: queue, exchange: "", routing_key: queue, redelivered: false)
    expect(m.delivery.properties.to_h.except(:headers)).to eq(
      content_type: "application/json", content_encoding: nil, delivery_mode: 2, priority: nil, correlation_id: nil,
      reply_to: nil, expiration: nil, message_id: envelope.id, timestamp: 1_700_000_000, type: "order.placed.v1",
      user_id: nil, app_id: mq.origin, cluster_id: nil
    )
    expect(m.delivery.properties.headers).to include("tenant" => "acme", "x-acemq-id" => envelope.id, "x-acemq-attempt" => 1)
    expect(m.delivery.properties).to be_persistent.and be_frozen
    expect(m.delivery.properties.time).to eq(Time.at(1_700_000_000))
    expect(m).to be_frozen
    expect(m.inspect).to include(envelope.id, "order.placed.v1", "A-1")
  end

  it "reads a message without a timestamp as nil, not 1970" do
    m = consumed({ "n" => 1 }, AceMQ::AMQP::Envelope.new(timestamp: nil))
    expect([m.envelope.timestamp, m.delivery.properties.timestamp, m.delivery.properties.time]).to eq([nil, nil, nil])
    expect(AceMQ::AMQP::Envelope.new.timestamp).to be_within(5).of(Time.now.to_i)
  end

  it "keeps a number JSON.parse reads exactly, exactly" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    text = '{"f":0.1000000000000000055511151231257827,"i":123456789012345678901234567890}'
    m = consumed(JSON.parse(text), AceMQ::AMQP::Envelope.new)
    expect(m.payload).to eq(JSON.parse(text))
  end

  it "shares one frozen String for a key across messages, as Hash#[]= would" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    2.times { |i| mq.publish({ "order_id" => "A-#{i}" }, to: queue) }
    got = Queue.new
    sub = mq.consume(queue) { |m| got << m.payload; AceMQ::AMQP::Ack.accept }
    first = got.pop
    second = got.pop
    sub.cancel
    expect(first.keys.first).to equal(second.keys.first)
    expect(first["order_id"]).not_to equal(second["order_id"])
  end

  # Each place in a payload remembers the key it held last time; another
  # key there, or the same keys in another order, must still read as sent.
  it "reads keys right when their places hold other keys than last time" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    sent = [{ "a" => 1, "b" => { "c" => 2 } }, { "b" => { "c" => 3 }, "a" => 4 }, { "a" => 5, "bb" => 6, "c" => [{ "a" => 7 }] },
            { "x" * 80 => 8, "a" => 9 }, { "a" => 1, "b" => { "c" => 2 } }]
    sent.each { |p| mq.publish(p, to: queue) }
    got = Queue.new
    sub = mq.consume(queue) { |m| got << m.payload; AceMQ::AMQP::Ack.accept }
    read = Array.new(sent.size) { got.pop }
    sub.cancel
    expect(read).to eq(sent)
    expect(read.map { |p| p.keys.map(&:to_s) }).to eq(sent.map(&:keys))
    expect(read.first.keys.first).to equal(read.last.keys.first)
  end

  # The engine keeps the keys it has interned (a bounded table, pinned for
  # the GC): a compaction must not move them from under it, and keys past
  # the table's bounds are interned as before.
  it "builds keys it keeps across a GC compaction, and keys past its table too" do
    in_child { keys_across_compaction }
  end

  def keys_across_compaction
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    long = "k" * 100
    many = Array.new(5000) { |i| "key-#{i}" }
    mq.publish({ "order_id" => "A-0", long => 1 }, to: queue)
    mq.publish(many.to_h { |k| [k, k] }, to: queue)
    mq.publish({ "order_id" => "A-2", long => 3, "key-4999" => 4 }, to: queue)
    got = Queue.new
    sub = mq.consume(queue) { |m| got << m.payload; AceMQ::AMQP::Ack.accept }
    first = got.pop
    GC.start
    GC.compact if GC.respond_to?(:compact)
    flood = got.pop
    last = got.pop
    sub.cancel
    expect(first).to eq("order_id" => "A-0", long => 1)
    expect(flood).to eq(many.to_h { |k| [k, k] })
    expect(last).to eq("order_id" => "A-2", long => 3, "key-4999" => 4)
    expect(last.keys.first).to equal(first.keys.first)
    expect(last.keys).to all(be_frozen)
    expect(last.keys.map(&:encoding)).to all(eq(Encoding::UTF_8))
  end

  it "keeps a key alive that nothing else refers to any more" do
    in_child { key_alive_across_compaction }
  end

  def key_alive_across_compaction
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    key = -> { "only-here-#{queue}" } # a new String each call, never a literal Ruby interned
    read = lambda do |n|
      mq.publish({ key.call => n }, to: queue)
      got = Queue.new
      sub = mq.consume(queue) { |m| got << m.payload.keys.first.dup; AceMQ::AMQP::Ack.accept }
      text = got.pop
      sub.cancel
      text
    end
    expect(read.call(1)).to eq(key.call)
    # Nothing holds the first message's key now but the engine's table.
    3.times do
      GC.start(full_mark: true, immediate_sweep: true)
      Array.new(50_000) { |i| "filler #{i}" }
    end
    GC.compact if GC.respond_to?(:compact)
    expect(read.call(2)).to eq(key.call)
  end

  it "answers NativeDelivery's old readers with the same values, each warning once that it is deprecated" do
    envelope = AceMQ::AMQP::Envelope.new(type: "t", timestamp: 1_700_000_000)
    m = consumed({ "a" => 1 }, envelope)
    AceMQ::AMQP::Message::Consumed.instance_variable_set(:@warned, {})
    expect { expect(m.native_delivery.origin).to eq(mq.origin) }
      .to output(/NativeDelivery#origin is deprecated .*read message\.envelope\.origin/).to_stderr
    expect { m.origin }.not_to output.to_stderr
    expect { expect(m.queue).to eq(queue) }.to output(/delivery\.queue/).to_stderr
    read = -> { [m.timestamp, m.exchange, m.routing_key, m.redelivered?, m.properties[:type]] }
    expect { expect(read.call).to eq([1_700_000_000, "", queue, false, "t"]) }
      .to output(/#timestamp.*#exchange.*#routing_key.*#redelivered\?.*#properties/m).to_stderr
  ensure
    AceMQ::AMQP::Message::Consumed.instance_variable_set(:@warned, {})
  end

  it "is a NativeDelivery only the engine makes" do
    expect { AceMQ::AMQP::NativeDelivery.new }.to raise_error(TypeError, /allocator undefined/)
  end

  it "answers the same readers when built by hand" do
    envelope = AceMQ::AMQP::Envelope.new(type: "t", headers: { "h" => 1 })
    m = described_class.new(payload: { "a" => 1 }, envelope: envelope)
    expect([m.payload, m.id, m.type, m.attempt, m.headers, m.delivery, m.native_delivery])
      .to eq([{ "a" => 1 }, envelope.id, "t", 1, { "h" => 1 }, nil, nil])
    expect(m).to be_frozen
  end
end
