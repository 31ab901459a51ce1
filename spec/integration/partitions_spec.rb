# frozen_string_literal: true

require "acemq/rails"

# Partitions (issue 36 part 1) against RabbitMQ: a key always lands in the
# partition the engine computes, the partition queues are single active
# consumer (a second subscriber gets nothing until the first goes, then
# takes over in order), and a bad key is refused with its own error while
# the publisher goes on. Several runner processes and kill -9:
# drill/ordering.rb (`DRILL_PHASES=order rake drill`).
RSpec.describe "partitioned queues" do
  let(:queue) { unique("parts") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("parts-spec")) }
  let(:other) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("parts-spec-2")) }

  after do
    other.close
    mq.close
  end

  def consumer_class(q)
    Class.new(AceMQ::Rails::Consumer) do
      queue q
      partitions 4, by: ->(m) { m.payload["account_id"] }
      def self.name = "PartsSpecConsumer"
    end
  end

  it "sends each key to the partition the engine computes, and refuses a nil key without stopping" do
    klass = consumer_class(queue)
    klass.topology.apply(mq)
    expect(klass.consume_queues).to eq((0..3).map { |p| "#{queue}.p#{p}" })
    AceMQ::Rails.publisher = mq
    keys = (1..12).map { |n| "acct-#{n}" }
    keys.each { |k| klass.publish({ "account_id" => k }) }
    expect { klass.publish({ "account_id" => nil }) }.to raise_error(AceMQ::AMQP::PartitionKeyMissing, /returned nil/)
    klass.publish({ "account_id" => "acct-1" })
    expected = (keys + ["acct-1"]).map { |k| AceMQ::AMQP.partition_queue(queue, k, 4) }.tally
    eventually { klass.consume_queues.to_h { |q| [q, mq.queue_counts(q)[:ready]] } == klass.consume_queues.to_h { |q| [q, expected[q].to_i] } }
    expect(expected.size).to be > 1 # the keys spread
    expect { mq.publish({}, to: queue, partition_key: "k") }.to raise_error(AceMQ::AMQP::ConfigurationError, /partitions: is missing/)
    # What the break-it run found: counts a RangeError or truncated, keys
    # whose to_s changes per object, an empty key. Each refused, nothing sent.
    # -1 and 70000 are whole numbers core refuses, named as given.
    { -1 => /between 1 and 1024 \(got -1\)/, 70_000 => /between 1 and 1024 \(got 70000\)/, 2**70 => /whole number/,
      8.9 => /whole number/, Rational(17, 2) => /whole number/, 0 => /between 1 and 1024/ }.each do |count, words|
      expect { mq.publish({}, to: queue, partition_key: "k", partitions: count) }.to raise_error(AceMQ::AMQP::ConfigurationError, words)
    end
    expect { mq.publish({}, to: queue, partition_key: Object.new, partitions: 4) }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /String, Symbol or Integer/)
    expect { mq.publish({}, to: queue, partition_key: "", partitions: 4) }.to raise_error(AceMQ::AMQP::PartitionKeyMissing, /empty/)
    expect { mq.publish({}, to: queue, partition_key: nil, partitions: 4) }.to raise_error(AceMQ::AMQP::PartitionKeyMissing, /is nil/)
    expect { klass.publish({ "account_id" => "" }) }.to raise_error(AceMQ::AMQP::PartitionKeyMissing, /returned ""/)
    # An Integer key and its text are one key.
    expect(AceMQ::AMQP::Connection.partition(7, 4)).to eq(AceMQ::AMQP::Connection.partition("7", 4))
  ensure
    AceMQ::Rails.publisher = nil
  end

  # Issue 49: a batch's publish and an outbox record took no partition key;
  # the undocumented AceMQ::AMQP.partition_queue was the only way.
  it "takes partition keys in a batch and in an outbox record, to the partition publish would use" do
    klass = consumer_class(queue)
    klass.topology.apply(mq)
    keys = (1..8).map { |n| "acct-#{n}" }
    mq.batch { |b| keys.each { |k| b.publish({ "account_id" => k }, to: queue, partition_key: k, partitions: 4) } }
    mq.batch(stream: true) { |b| keys.each { |k| b.publish({ "account_id" => k }, to: queue, partition_key: k, partitions: 4) } }
    expect { mq.batch { |b| b.publish({}, to: queue, partitions: 4) } }.to raise_error(AceMQ::AMQP::PartitionKeyMissing, /is nil/)
    records = keys.map { |k| AceMQ::AMQP::Patterns.record(mq, { "account_id" => k }, to: queue, partition_key: k, partitions: 4) }
    expect(records.map(&:routing_key)).to eq(keys.map { |k| AceMQ::AMQP.partition_queue(queue, k, 4) })
    expected = keys.map { |k| AceMQ::AMQP.partition_queue(queue, k, 4) }.tally.transform_values { |n| n * 2 }
    eventually { klass.consume_queues.to_h { |q| [q, mq.queue_counts(q)[:ready]] } == klass.consume_queues.to_h { |q| [q, expected[q].to_i] } }
    # One past the delay cascade's 2^28 - 1 s, refused where it is built,
    # as publish refuses it, not when the relay sends it.
    expect { AceMQ::AMQP::Patterns.record(mq, {}, to: queue, delay: 2**28) }.to raise_error(AceMQ::AMQP::ConfigurationError, /at most 268435455 s/)
  end

  it "hands a partition to one subscriber at a time, and to the next, in order, when it goes" do
    klass = consumer_class(queue)
    klass.topology.apply(mq)
    part = AceMQ::AMQP.partition_queue(queue, "acct-7", 4)
    10.times { |n| mq.publish({ "account_id" => "acct-7", "n" => n }, to: queue, partition_key: "acct-7", partitions: 4) }
    first = []
    second = []
    gate = Queue.new
    # keep_order: what a partitioned consumer class subscribes with.
    a = mq.consume(part, prefetch: 4, keep_order: true) do |m|
      first << m.payload["n"]
      gate.pop if first.size == 3 # hold the third until told
      AceMQ::AMQP::Ack.accept
    end
    eventually { first.size == 3 }
    b = other.consume(part, prefetch: 4, keep_order: true) do |m|
      second << m.payload["n"]
      AceMQ::AMQP::Ack.accept
    end
    sleep 0.5
    expect(second).to eq([]) # standing by: the partition is the first's
    # A runner stopping: takes nothing more, lets the held one finish, and
    # closes; the broker gives what it held back at the head, in order.
    a.stop_taking
    sleep 0.3
    expect(second).to eq([]) # still the first's while it holds messages
    gate << :go
    a.cancel
    eventually { first.size + second.size >= 10 }
    expect(first).to eq([0, 1, 2])
    expect(second).to eq((3..9).to_a) # taken over from where the first stopped, in order
    b.cancel
  end

  it "pauses a partition's consumer without handing the standby anything out of order" do
    klass = consumer_class(queue)
    klass.topology.apply(mq)
    part = AceMQ::AMQP.partition_queue(queue, "acct-9", 4)
    10.times { |n| mq.publish({ "account_id" => "acct-9", "n" => n }, to: queue, partition_key: "acct-9", partitions: 4) }
    first = []
    second = []
    gate = Queue.new
    a = mq.consume(part, prefetch: 4, keep_order: true) do |m|
      first << m.payload["n"]
      gate.pop if first.size == 3
      AceMQ::AMQP::Ack.accept
    end
    eventually { first.size == 3 }
    b = other.consume(part, prefetch: 4, keep_order: true) do |m|
      second << m.payload["n"]
      AceMQ::AMQP::Ack.accept
    end
    pausing = Thread.new { a.pause } # waits for the handler holding 2
    sleep 0.3
    expect(second).to eq([]) # nothing handed over while a holds messages
    gate << :go
    pausing.join(10)
    expect(a.paused?).to be(true)
    eventually { second.size == 7 }
    expect(first).to eq([0, 1, 2])
    expect(second).to eq((3..9).to_a) # the held window first, in order
    a.resume # a stands by now: b has the partition
    mq.publish({ "account_id" => "acct-9", "n" => 10 }, to: queue, partition_key: "acct-9", partitions: 4)
    eventually { second.last == 10 }
    expect(first).to eq([0, 1, 2])
    a.cancel
    b.cancel
  end
end
