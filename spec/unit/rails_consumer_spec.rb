# frozen_string_literal: true

require "acemq/rails"

# The consumer-class DSL on memory://: what each macro declares, what the
# helpers return, and the pipeline a runner subscribes.
RSpec.describe AceMQ::Rails::Consumer do
  let(:mq) { AceMQ::AMQP::Connection.open(memory_url) }
  # Break-it: -1 and 70000 were RangeError, NaN a FloatDomainError, 1.5
  # one partition, and a nil count with by: consumed the plain queue.
  it "refuses a partition count core would refuse, naming the class and the count as given" do
    by = ->(m) { m.payload["k"] }
    klass = Class.new(described_class) { define_singleton_method(:to_s) { "OddPartitions" } }
    [[-1, /between 1 and 1024 \(got -1\)/], [70_000, /between 1 and 1024 \(got 70000\)/], [2**40, /got 1099511627776/],
     [0, /between 1 and 1024 \(got 0\)/], [1.5, /must be a whole number/], [Float::NAN, /must be a whole number/],
     ["many", /must be a whole number/]].each do |count, why|
      expect { klass.partitions(count, by: by) }.to raise_error(AceMQ::AMQP::ConfigurationError, /\AOddPartitions: .*#{why}/)
    end
    expect { klass.partitions(nil, by: by) }.to raise_error(AceMQ::AMQP::ConfigurationError, /OddPartitions: partitions needs a count/)
    klass.partitions("4", by: by)
    expect(klass.partitions[:count]).to eq(4)
  end

  it "takes its default concurrency from core, as consume does (one place for it)" do
    core = AceMQ::AMQP::CONSUME_DEFAULTS.fetch(:concurrency)
    expect(core).to eq(1)
    expect(Class.new(described_class).concurrency).to eq(core)
    AceMQ::AMQP::Topology.new.queue("defaults-spec").apply(mq)
    sub = mq.consume("defaults-spec") { AceMQ::AMQP::Ack.accept }
    expect(sub.concurrency).to eq(core)
  ensure
    sub&.cancel
  end

  let(:message) do
    AceMQ::AMQP::Message.new(payload: { "order_id" => "A-1" },
                             envelope: AceMQ::AMQP::Envelope.new(id: "m-1", type: "payment.due.v1"))
  end

  after { mq.close }

  # A named class per example, so the registry (which is by name) sees it.
  def consumer_class(name = "SpecConsumer#{SecureRandom.hex(4)}", parent: described_class, &body)
    klass = Class.new(parent)
    Object.const_set(name, klass)
    (@defined ||= []) << name
    klass.class_eval(&body) if body
    klass
  end

  after { (@defined || []).each { |n| Object.send(:remove_const, n) if Object.const_defined?(n) } }

  it "declares the seed's macros and keeps one setting per class, inherited by subclasses" do
    base = consumer_class { retries max_attempts: 5, initial_delay: 1, max_delay: 300 }
    payments = consumer_class(parent: base) do
      queue "shop.payments"
      concurrency 4
      prefetch 16
    end
    expect(payments.queue_name).to eq("shop.payments")
    expect(payments.retries.to_h).to eq(max_attempts: 5, initial_delay: 1.0, max_delay: 300.0)
    expect([payments.concurrency, payments.prefetch, payments.batch]).to eq([4, 16, 1])
    expect(base.queue_name).to be_nil
    expect(base.concurrency).to eq(1)
    # An abstract base (no queue) is never run; the concrete class is.
    expect(described_class.consumers).to include(payments)
    expect(described_class.consumers).not_to include(base)
  end

  it "takes a handler deadline, bounded by the idempotency claim when none is named" do
    mq = AceMQ::AMQP::Connection.open("memory://#{SecureRandom.hex(4)}")
    timed = consumer_class { queue "timed"; timeout 5 }
    expect(timed.timeout).to eq(5.0)
    expect(timed.describe).to include(timeout: 5.0)
    AceMQ::AMQP::Topology.new.queue("timed").queue("guarded").apply(mq)
    sub = timed.subscribe(mq)
    expect(sub.timeout).to eq(5.0)
    sub.cancel
    store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new(claim_timeout: 90)
    guarded = consumer_class { queue "guarded"; idempotent store: store }
    sub = guarded.subscribe(mq, around: ->(&blk) { blk.call }) # through the runner's executor wrapper too
    expect(sub.timeout).to eq(90.0)
    sub.cancel
    expect { consumer_class { queue "x"; timeout 0 } }.to raise_error(AceMQ::AMQP::ConfigurationError, /longer than zero/)
    late = consumer_class { queue "guarded"; timeout 120; idempotent store: store }
    expect { late.subscribe(mq) }.to raise_error(AceMQ::AMQP::ConfigurationError, /claim_timeout \(90s\)/)
    mq.close
  end

  it "refuses settings that cannot work, at class definition, naming the class" do
    expect { consumer_class { concurrency 0 } }.to raise_error(AceMQ::AMQP::ConfigurationError, /concurrency must be at least 1/)
    expect { consumer_class { prefetch 70_000 } }.to raise_error(AceMQ::AMQP::ConfigurationError, /at most 65535/)
    expect { consumer_class { retries max_attempts: 0 } }.to raise_error(AceMQ::AMQP::ConfigurationError, /at least 1/)
    expect { consumer_class { retries attempts: 3 } }.to raise_error(AceMQ::AMQP::ConfigurationError, /unknown retries/)
    expect { consumer_class { concurrency "many" } }.to raise_error(AceMQ::AMQP::ConfigurationError, /whole number/)
    expect { consumer_class { idempotent store: Object.new } }.to raise_error(AceMQ::AMQP::ConfigurationError, /first_time\?/)
    klass = consumer_class { batch 10 }
    klass.queue "q"
    expect { klass.pipeline(klass.new) }.to raise_error(AceMQ::AMQP::ConfigurationError, /needs the idempotent macro/)
    expect { consumer_class.topology }.to raise_error(AceMQ::AMQP::ConfigurationError, /has no queue/)
  end

  it "answers with the helpers' Acks; retry_later because `retry` is a keyword" do
    klass = consumer_class do
      queue "q"
      define_method(:call) do |m|
        case m.payload["do"]
        when "accept" then accept
        when "reject" then reject("bad shape", error: ArgumentError)
        else retry_later("gateway down")
        end
      end
    end
    c = klass.new
    msg = ->(what) { AceMQ::AMQP::Message.new(payload: { "do" => what }) }
    expect(c.call(msg.call("accept"))).to be_accept
    expect(c.call(msg.call("reject"))).to eq(AceMQ::AMQP::Ack.reject("bad shape", error: ArgumentError))
    expect(c.call(msg.call("later"))).to eq(AceMQ::AMQP::Ack.retry("gateway down"))
    expect(c.private_methods).to include(:accept, :reject, :retry_later, :publish)
    expect { described_class.new.call(message) }.to raise_error(NotImplementedError, /must define call/)
  end

  it "closes Patterns.idempotent over the instance, as the seed's PaymentsConsumer does" do
    store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new
    charges = []
    klass = consumer_class do
      queue "shop.payments"
      define_method(:call) { |m| once.call(m) }
      define_method(:once) do
        @once ||= AceMQ::AMQP::Patterns.idempotent(store) do |m|
          charges << m.payload["order_id"]
          accept # the consumer's own private helper: the block closes over self
        end
      end
      private :once
    end
    consumer = klass.new
    3.times { expect(consumer.call(message)).to be_accept }
    expect(charges).to eq(["A-1"])
  end

  it "binds its queue to exchanges, declaring them, and routes by the keys" do
    klass = consumer_class do
      queue "billing"
      bind "orders-events", routing_key: %w[order.placed order.paid]
      bind "audit", type: :fanout
      define_method(:call) { |_m| accept }
    end
    klass.topology.apply(mq)
    klass.topology.apply(mq) # from every process: idempotent
    mq.publish({ "n" => 1 }, to: "order.placed", exchange: "orders-events")
    mq.publish({ "n" => 2 }, to: "order.paid", exchange: "orders-events")
    mq.publish({ "n" => 3 }, to: "anything", exchange: "audit")
    expect { mq.publish({ "n" => 4 }, to: "order.cancelled", exchange: "orders-events") }
      .to raise_error(AceMQ::AMQP::Unroutable)
    expect(mq.queue_depth("billing")).to eq(ready: 3, unacked: 0)
    expect(mq.queue_depth("billing.dlq")).to eq(ready: 0, unacked: 0)
  end

  it "subscribes the idempotent pipeline with its ladder, batch and on_error, wrapped in around:" do
    store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new
    handled = Queue.new
    errors = []
    klass = consumer_class do
      queue "payments"
      retries max_attempts: 2, initial_delay: 1, max_delay: 1
      batch 10
      idempotent store: store, key: ->(m) { (id = m.payload["order_id"]) && "charge:#{id}" }
      on_error { |e| errors << e }
      define_method(:call) do |m|
        handled << m.payload["order_id"]
        m.payload["fail"] ? retry_later("not yet") : accept
      end
    end
    klass.topology.apply(mq)
    wraps = 0
    around = ->(&blk) { wraps += 1; blk.call }
    sub = klass.subscribe(mq, around: around)
    mq.publish({ "order_id" => "A-1" }, to: "payments")
    # Another message with the same business key, once the first is handled:
    # in one batch with it, it would find the key claimed, not confirmed, and
    # be retried before it is turned away.
    eventually { sub.stats[:accepted] == 1 }
    mq.publish({ "order_id" => "A-1" }, to: "payments")
    mq.publish({ "order_id" => "B-1", "fail" => true }, to: "payments")
    mq.publish({ "nothing" => true }, to: "payments")   # no key: rejected as fatal
    eventually { sub.stats[:accepted] == 2 && sub.stats[:retried] == 1 && sub.stats[:dead_lettered] == 1 }
    mq.advance_clock(1)
    eventually { sub.stats[:dead_lettered] == 2 } # B-1 past max_attempts 2
    sub.cancel
    expect(Array.new(handled.size) { handled.pop }.tally).to eq("A-1" => 1, "B-1" => 2)
    expect(wraps).to be >= 3
    letters = mq.peek_dead_letters("payments", limit: 10)
    expect(letters.map(&:reason)).to include(a_string_matching(/key is missing/), a_string_matching(/not yet/))
    expect(errors).to eq([])
  end

  it "gives on_error the errors met outside the handler, falling back to the runner's" do
    klass = consumer_class { queue "q" }
    fallback = ->(e) { e }
    expect(klass.on_error).to be_nil
    klass.on_error(fallback)
    expect(klass.on_error).to be(fallback)
    expect { klass.on_error(42) }.to raise_error(AceMQ::AMQP::ConfigurationError, /callable/)
  end

  it "publishes from a handler on AceMQ::Rails.publisher" do
    AceMQ::AMQP::Topology.new.queue("receipts").apply(mq)
    AceMQ::Rails.publisher = mq
    klass = consumer_class do
      queue "q"
      define_method(:call) do |m|
        publish({ "paid" => m.payload["order_id"] }, to: "receipts", type: "payment.taken.v1")
        accept
      end
    end
    expect(klass.new.call(message)).to be_accept
    expect(mq.queue_depth("receipts")).to eq(ready: 1, unacked: 0)
  ensure
    AceMQ::Rails.publisher = nil
  end
end
