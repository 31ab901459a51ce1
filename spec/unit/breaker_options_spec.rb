# frozen_string_literal: true

# circuit_breaker: on:, ignore: and probe: (issue 49 part 2) with no broker:
# what BreakerOptions takes and refuses, how it matches a handler's
# exception, and, on memory://, that its answer is what the engine counts.
RSpec.describe AceMQ::AMQP::BreakerOptions do
  let(:timeout_error) { Class.new(IOError) }

  it "matches with is_a?, callables and ignore:, and leaves the engine to count everything when given neither" do
    o = described_class.from(failures: 3, within: 10, pause: 30, on: [IOError, ->(e) { e.message.include?("503") }],
                             ignore: ->(e) { e.message.include?("flaky") })
    expect(o.counts?(timeout_error.new("read timed out"))).to be(true)
    expect(o.counts?(RuntimeError.new("gateway said 503"))).to be(true)
    expect(o.counts?(NoMethodError.new("undefined method `total' for nil"))).to be(false)
    expect(o.counts?(IOError.new("flaky link"))).to be(false)
    expect(o.native).to eq([3, 10.0, 30.0, nil, [], []])
    # A single class needs no array; the kinds go to the engine by name.
    single = described_class.from(failures: 1, within: 1, pause: 5, probe: 1, on: IOError, ignore: :retry)
    expect(single.counts?(timeout_error.new)).to be(true)
    expect(single.native).to eq([1, 1.0, 5.0, 1.0, [], ["retry"]])
    expect(described_class.from(failures: 1, within: 1, pause: 1).counts?(NoMethodError.new)).to be_nil
    expect(described_class.from(nil)).to be_nil
  end

  it "refuses what it cannot match or count, saying what it takes" do
    expect { described_class.from(failures: 1, within: 1, pause: 1, on: "IOError") }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /on: takes exception classes/)
    expect { described_class.from(failures: 1, within: 1, pause: 1, ignore: [:bug]) }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /ignore: takes exception classes/)
    expect { described_class.from(failures: 1, within: 1, pause: 1, probe: "soon") }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /probe seconds/)
    expect { described_class.from(failures: 1, within: 1, pause: 1, retry: true) }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /takes failures:, within: and pause:/)
  end

  it "counts a failure whose matcher raised, and says so through on_error (memory://)" do
    mq = AceMQ::AMQP::Connection.open(memory_url)
    queue = unique("breaker-unit")
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    heard = []
    sub = mq.consume(queue, on_error: ->(e) { heard << e },
                            circuit_breaker: { failures: 1, within: 30, pause: 60, on: ->(_e) { raise KeyError, "matcher bug" } }) do |_m|
      raise NoMethodError, "a bug the matcher never got to judge"
    end
    mq.publish({ "n" => 1 }, to: queue)
    eventually { sub.breaker == "open" }
    expect(heard.map(&:message).grep(/on:\/ignore: raised KeyError: matcher bug; the failure counts/).size).to eq(1)
    sub.cancel
  ensure
    mq&.close
  end

  it "lets a failure on: does not name take the ladder, leaving the breaker closed (memory://)" do
    mq = AceMQ::AMQP::Connection.open(memory_url)
    queue = unique("breaker-unit")
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    sub = mq.consume(queue, retries: { max_attempts: 2, initial_delay: 0.05, max_delay: 0.05 },
                            circuit_breaker: { failures: 1, within: 30, pause: 60, on: [IOError] }) do |_m|
      nil.total
    end
    mq.publish({ "n" => 1 }, to: queue)
    eventually { sub.stats[:dead_lettered] == 1 }
    expect(sub.breaker).to eq("closed")
    expect(sub.stats[:retried]).to eq(1)
    sub.cancel
  ensure
    mq&.close
  end
end
