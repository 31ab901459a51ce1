# frozen_string_literal: true

require "acemq/rails"

# The circuit breaker and the throttle through Ruby (issue 36 parts 3-4)
# against RabbitMQ: what the DSL declares reaches the engine, a handler that
# keeps raising pauses the subscription with its buffered messages back on
# the queue unspent, one trial closes it, and bad settings are refused with
# what to give. The state machine itself is core's (core/tests/flow.rs); a
# downstream down for 20 s is drill/breaker.rb.
RSpec.describe "circuit breaker and throttle (Ruby)" do
  let(:queue) { unique("breaker") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("breaker-spec")) }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
  after { mq.close }

  it "opens after the failures (not the rejects), gives back what it held, and closes after a good trial" do
    down = true
    seen = []
    events = []
    listener = AceMQ.subscribe("subscription.acemq") { |e| events << e[:state] if e[:queue] == queue }
    20.times { |n| mq.publish({ "n" => n, "bad" => n.zero? }, to: queue) }
    # The failed three wait 4 s on the ladder: the queue's count below is
    # what the paused consumer gave back, not copies coming home.
    sub = mq.consume(queue, concurrency: 1, prefetch: 10, retries: { initial_delay: 4 },
                            circuit_breaker: { failures: 3, within: 30, pause: 0.5 }) do |m|
      seen << m.payload["n"]
      next AceMQ::AMQP::Ack.reject("bad message") if m.payload["bad"] # not counted: about the message
      raise "downstream: 503" if down

      AceMQ::AMQP::Ack.accept
    end
    eventually { sub.breaker == "open" }
    expect(seen.first(4)).to eq([0, 1, 2, 3]) # the reject and three failures
    eventually { sub.stats[:retried] == 3 } # copied to the ladder in the background
    # Nothing held: the rest of the window is back on the queue, unspent.
    eventually { mq.queue_counts(queue)[:ready] == 16 }
    down = false
    eventually(timeout: 15) { sub.stats[:accepted] == 19 }
    expect(sub.breaker).to eq("closed")
    expect(sub.stats[:dead_lettered]).to eq(1)
    eventually { events.include?("circuit_closed") }
    expect(events.first(3)).to eq(%w[circuit_open circuit_half_open circuit_trial])
    sub.cancel
  ensure
    AceMQ.unsubscribe(listener) if listener
  end

  it "takes circuit_breaker, throttle and single_active_consumer in a consumer class, and refuses bad settings" do
    klass = Class.new(AceMQ::Rails::Consumer) do
      circuit_breaker failures: 10, within: 30, pause: 60
      throttle 100, per: 1
      single_active_consumer true
      def self.name = "BreakerSpecConsumer"
    end
    expect(klass.circuit_breaker).to eq(failures: 10, within: 30.0, pause: 60.0)
    expect(klass.throttle).to eq(limit: 100, per: 1.0)
    sac = "#{queue}-sac"
    klass.queue(sac)
    klass.topology.apply(mq)
    # Declared single active consumer: the same queue without it is refused.
    expect { AceMQ::AMQP::Topology.new.queue(sac).apply(mq) }.to raise_error(AceMQ::AMQP::PreconditionFailed)
    sub = klass.subscribe(mq, instance: klass.new.tap { |c| c.define_singleton_method(:call) { |_m| accept } })
    expect(sub.breaker).to eq("closed")
    sub.cancel
    # The class refuses them as consume would, by core's rules (issue 50:
    # checked once), with its own name in front.
    named = lambda do |&body|
      Class.new(AceMQ::Rails::Consumer) do
        define_singleton_method(:to_s) { "BadSpecConsumer" } # what a named class says
        class_eval(&body)
      end
    end
    expect { named.call { circuit_breaker failures: 0, within: 1, pause: 1 } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /\ABadSpecConsumer: circuit_breaker needs failures of at least 1/)
    expect { named.call { circuit_breaker failures: 3, within: 1, pause: 1, probe: 2 } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /BadSpecConsumer: .*probe interval above zero and at most pause/)
    expect { named.call { circuit_breaker failures: 2**40, within: 1, pause: 1 } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /failures must be a whole number from 1 to 4294967295 \(got 1099511627776\)/)
    expect { named.call { throttle 0 } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /\ABadSpecConsumer: throttle needs a limit of at least 1/)
    expect { named.call { throttle 5, per: -1 } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /BadSpecConsumer: throttle: per must be a number of seconds above zero \(got -1/)
    expect { named.call { throttle 5, per: 0 } }.to raise_error(AceMQ::AMQP::ConfigurationError, /positive period/)
    expect { named.call { throttle "many" } }.to raise_error(AceMQ::AMQP::ConfigurationError, /limit is a whole number/)
    expect { mq.consume(queue, throttle: { limit: 0 }) { nil } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /throttle needs a limit of at least 1/)
    expect { mq.consume(queue, circuit_breaker: { failures: 3 }) { nil } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /takes failures:, within: and pause:/)
    # Break-it: these were TypeError ("can't convert Integer into Hash").
    [5, true].each do |bad|
      expect { mq.consume(queue, throttle: bad) { nil } }.to raise_error(AceMQ::AMQP::ConfigurationError, /throttle takes limit:/)
      expect { mq.consume(queue, circuit_breaker: bad) { nil } }.to raise_error(AceMQ::AMQP::ConfigurationError, /circuit_breaker takes failures:/)
    end
    # And a value that cannot be a duration or a count is named as given,
    # not as the 0 it would have become.
    expect { mq.consume(queue, throttle: { limit: -1 }) { nil } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /limit must be a whole number from 1 to 4294967295 \(got -1\)/)
    expect { mq.consume(queue, circuit_breaker: { failures: 1, within: -1, pause: 1 }) { nil } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /circuit_breaker: within must be a number of seconds above zero \(got -1(\.0)?\)/)
    expect { mq.consume(queue, throttle: { limit: 1, per: Float::NAN }) { nil } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /per must be a number of seconds above zero \(got NaN\)/)
    # The connection goes on: a good subscription after the bad ones.
    mq.publish({ "n" => 1 }, to: queue)
    got = []
    good = mq.consume(queue, throttle: { limit: 5, per: 1 }) do |m|
      got << m.payload["n"]
      AceMQ::AMQP::Ack.accept
    end
    eventually { got == [1] }
    good.cancel
  end

  # Break-it: cancel waited for the throttle's next token (29 s at 1 per
  # 30 s, for ever at per: 2**40); a stopped consumer's threads now end.
  it "cancels at once a throttled consumer whose next token is an hour off, on RabbitMQ and memory://" do
    [mq, AceMQ::AMQP::Connection.open(memory_url)].each do |conn|
      q = "#{queue}-#{conn.memory? ? 'mem' : 'mq'}-stop"
      AceMQ::AMQP::Topology.new.queue(q).apply(conn)
      4.times { |n| conn.publish({ "n" => n }, to: q) }
      got = Queue.new
      sub = conn.consume(q, concurrency: 2, throttle: { limit: 1, per: 3600 }) { |m| got << m.payload["n"] && AceMQ::AMQP::Ack.accept }
      expect(got.pop).to eq(0)
      sleep 0.3
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      sub.cancel
      expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0).to be < 5
      expect(got.size).to eq(0) # none handed out without a token
      # Nothing lost: the three left go to the next consumer.
      rest = []
      again = conn.consume(q) { |m| rest << m.payload["n"] && AceMQ::AMQP::Ack.accept }
      eventually(timeout: 10) { rest.sort == [1, 2, 3] }
      again.cancel
    end
  end
end
