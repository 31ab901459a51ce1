# frozen_string_literal: true

require "acemq/rails"

# A breaker that knows what an outage is (issue 49 part 2), against
# RabbitMQ: a downstream that fails for a while (the issue's 20 s, scaled to
# 3 s with the intervals scaled alike) while a stream of bugs runs through
# the same consumer. With on: [IOError] the bugs take the ladder into the
# DLQ and never move the breaker; the outage opens it; nothing is spent: every
# good message is accepted exactly once, the DLQ holds the bugs and only
# them, and nothing is left anywhere. Then the same with pause: 60: the
# probe, not the pause, decides how soon the downstream's return is seen.
# The downstream's error: an IOError, so on: [IOError] counts it (is_a?).
class BreakerOutageDownstream < IOError; end

RSpec.describe "circuit breaker on: and probe: (Ruby)" do
  let(:queue) { unique("breaker-outage") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("breaker-outage-spec")) }
  let(:clock) { -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) } }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
  after { mq.close }

  # The breaker's transitions on this queue, [seconds, state], in order.
  def listen(transitions, t0)
    AceMQ.subscribe("subscription.acemq") do |e|
      transitions << [clock.call - t0, e[:state].to_s] if e[:queue] == queue && e[:state].to_s.start_with?("circuit")
    end
  end

  it "sends the bugs to the DLQ, opens on the outage alone, and spends nothing" do
    outage = [1.0, 4.0] # seconds after the start
    down = false
    lock = Mutex.new
    accepted = Hash.new(0)
    calls = Hash.new(0)
    transitions = []
    t0 = clock.call
    listener = listen(transitions, t0)
    sub = mq.consume(queue, concurrency: 2, prefetch: 10, retries: { max_attempts: 3, initial_delay: 0.2, max_delay: 0.4 },
                            circuit_breaker: { failures: 5, within: 30, pause: 2, probe: 0.5, on: [IOError] }) do |m|
      n = m.payload["n"]
      lock.synchronize { calls[n] += 1 }
      nil.total if m.payload["bug"] # a bug: NoMethodError, every time
      raise BreakerOutageDownstream, "downstream refused the connection" if down

      lock.synchronize { accepted[n] += 1 }
      AceMQ::AMQP::Ack.accept
    end
    # 20 a second for 6 s, every seventh a bug; the downstream is down
    # from 1 s to 4 s.
    bugs = []
    120.times do |n|
      now = clock.call - t0
      down = now >= outage[0] && now < outage[1]
      bug = (n % 7) == 3
      bugs << n if bug
      mq.publish({ "n" => n, "bug" => bug }, to: queue)
      sleep([(t0 + (n + 1) * 0.05) - clock.call, 0].max)
    end
    down = false
    good = (0...120).to_a - bugs
    eventually(timeout: 30) { lock.synchronize { accepted.size } == good.size }
    dlq = "#{queue}.dlq"
    eventually(timeout: 10) { mq.queue_counts(dlq)[:ready] == bugs.size }
    # Nothing more comes: the ladder and the queue are empty.
    eventually(timeout: 10) do
      [queue, "#{queue}.retry.200ms", "#{queue}.retry.400ms"].all? { |q| (c = mq.queue_counts(q)).nil? || c[:ready].zero? }
    end
    sleep 0.5
    expect(mq.queue_counts(dlq)[:ready]).to eq(bugs.size)
    letters = mq.peek_dead_letters(queue, limit: 100)
    expect(letters.map { |d| JSON.parse(d.body)["n"] }.sort).to eq(bugs)
    expect(letters.map(&:error_class).uniq).to eq(["NoMethodError"])
    expect(accepted.keys.sort).to eq(good)
    expect(accepted.values.uniq).to eq([1]) # exactly once
    expect(sub.stats[:accepted]).to eq(good.size)
    expect(sub.stats[:dead_lettered]).to eq(bugs.size)
    # Each bug ran its three attempts and no more.
    expect(bugs.map { |n| calls[n] }.uniq).to eq([3])

    states = transitions.map(&:last)
    opened = transitions.find { |_, s| s == "circuit_open" }
    expect(opened).not_to be_nil, "the outage did not open the breaker: #{transitions.inspect}"
    # The bugs before the outage (about 3 messages, 9 failures, failures: 5)
    # did not open it: the outage did.
    expect(opened.first).to be >= outage[0]
    expect(opened.first).to be < outage[1]
    expect(states.last).to eq("circuit_closed")
    closed = transitions.reverse.find { |_, s| s == "circuit_closed" }.first
    # Seen back within about one probe (0.5 s) of the end, not after a pause
    # counted from the last failed trial: generous, 3 s.
    expect(closed - outage[1]).to be < 3.0
    sub.cancel
  ensure
    AceMQ.unsubscribe(listener) if listener
  end

  it "with pause: 60 and probe: 1, sees the downstream back within about a probe, not the pause" do
    down = true
    up_at = nil
    transitions = []
    t0 = clock.call
    listener = listen(transitions, t0)
    40.times { |n| mq.publish({ "n" => n }, to: queue) }
    failed = 0
    sub = mq.consume(queue, concurrency: 1, prefetch: 10,
                            circuit_breaker: { failures: 3, within: 30, pause: 60, probe: 1, on: [IOError, :timeout] }) do |_m|
      if down
        failed += 1
        raise BreakerOutageDownstream, "503"
      end
      AceMQ::AMQP::Ack.accept
    end
    eventually { sub.breaker == "open" }
    at_open = failed
    # Failed trials reopen it for a probe each: two within a few seconds
    # (a 60 s pause would allow none).
    eventually(timeout: 10) { failed >= at_open + 2 }
    down = false
    up_at = clock.call - t0
    eventually(timeout: 30) { sub.breaker == "closed" }
    closed = transitions.reverse.find { |_, s| s == "circuit_closed" }.first
    # Within a probe (1 s) and a resubscription; 10 s is generous and far
    # from the 60 s pause.
    expect(closed - up_at).to be < 10.0
    eventually(timeout: 30) { sub.stats[:accepted] == 40 }
    expect(sub.stats[:dead_lettered]).to eq(0)
    sub.cancel
  ensure
    AceMQ.unsubscribe(listener) if listener
  end

  it "takes on:, ignore: and probe: in a consumer class and in consume, and refuses what it cannot match" do
    is_flaky = ->(e) { e.message.include?("flaky") }
    klass = Class.new(AceMQ::Rails::Consumer) do
      circuit_breaker failures: 10, within: 30, pause: 60, probe: 2, on: [IOError, :timeout], ignore: is_flaky
      def self.name = "BreakerOnSpecConsumer"
    end
    expect(klass.circuit_breaker).to eq(failures: 10, within: 30.0, pause: 60.0, probe: 2.0, on: [IOError, :timeout],
                                        ignore: [is_flaky])
    options = AceMQ::AMQP::BreakerOptions.from(klass.circuit_breaker)
    expect(options.counts?(BreakerOutageDownstream.new("down"))).to be(true) # a subclass counts
    expect(options.counts?(IOError.new("flaky link"))).to be(false) # ignore: wins
    expect(options.counts?(NoMethodError.new("bug"))).to be(false)
    expect(options.native).to eq([10, 30.0, 60.0, 2.0, ["timeout"], []])
    # Neither on: nor ignore:: the engine counts everything, as before.
    expect(AceMQ::AMQP::BreakerOptions.from(failures: 1, within: 1, pause: 1).counts?(NoMethodError.new)).to be_nil

    expect { mq.consume(queue, circuit_breaker: { failures: 3, within: 30, pause: 60, on: ["IOError"] }) { nil } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /on: takes exception classes/)
    expect { mq.consume(queue, circuit_breaker: { failures: 3, within: 30, pause: 5, probe: 10 }) { nil } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /probe interval above zero and at most pause/)
    expect { Class.new(AceMQ::Rails::Consumer) { circuit_breaker failures: 1, within: 1, pause: 1, probe: 0 } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /probe interval above zero/) # core's rule (issue 50)
    sub = klass.subscribe(mq, instance: klass.new.tap { |c| c.define_singleton_method(:call) { |_m| accept } }, queue: queue)
    expect(sub.breaker).to eq("closed")
    sub.cancel
  end
end
