# frozen_string_literal: true

# Queue arguments cross to the engine as a Hash converted value by value
# (ext/src/table.rs): what each Ruby value becomes, and what is refused.
RSpec.describe AceMQ::AMQP::Topology do
  let(:mq) { AceMQ::AMQP::Connection.open(memory_url) }
  let(:queue) { unique("topology") }

  after { mq.close }

  it "declares Symbol keys and values as their names, and nested values as they are" do
    args = { "x-max-length": 10, "x-overflow": :"reject-publish", "x-note": [1, 2.5, nil, true, false, { a: "b" }] }
    described_class.new.queue(queue, arguments: args).apply(mq)
    same = { "x-max-length" => 10, "x-overflow" => "reject-publish",
             "x-note" => [1, 2.5, nil, true, false, { "a" => "b" }] }
    expect { described_class.new.queue(queue, arguments: same).apply(mq) }.not_to raise_error
    expect { described_class.new.queue(queue, arguments: same.merge("x-note" => [1, 2.5])).apply(mq) }
      .to raise_error(AceMQ::AMQP::PreconditionFailed, /x-note/)
    expect { described_class.new.queue(queue, arguments: same.merge("x-overflow" => "drop-head")).apply(mq) }
      .to raise_error(AceMQ::AMQP::PreconditionFailed, /x-overflow/)
  end

  it "keeps rows the engine reads by name, which still come apart by position" do
    t = described_class.new.exchange("ex", type: :topic).queue(queue, arguments: { a: 1 }, type: :quorum)
                       .bind(queue, to: "ex", routing_key: "k.*")
    expect(t.exchanges.first).to have_attributes(name: "ex", type: "topic")
    expect(t.queues.first).to have_attributes(name: queue, arguments: { "a" => 1 }, type: "quorum")
    expect(t.bindings.first).to have_attributes(queue: queue, exchange: "ex", routing_key: "k.*")
    name, arguments, type = t.queues.first
    expect([name, arguments, type]).to eq([queue, { "a" => 1 }, "quorum"])
    expect(t.bindings.map { |q, e, k| "#{q}<-#{e}/#{k}" }).to eq(["#{queue}<-ex/k.*"])
    expect(t.exchanges.first[0]).to eq("ex")
    expect(t.queues.first).to be_frozen
  end

  it "is declared from either side: topology.apply(mq) or mq.apply(topology), and mq.apply takes nothing else" do
    t = described_class.new.queue(queue)
    expect(mq.apply(t)).to be(mq)
    mq.publish({ "n" => 1 }, to: queue)
    expect(mq.teardown(t, force: true)).to include(queue, "#{queue}.dlq")
    expect { mq.apply([[queue, nil, nil]]) }.to raise_error(AceMQ::AMQP::ConfigurationError, /apply takes an AceMQ::AMQP::Topology, got Array/)
    expect { mq.teardown("q") }.to raise_error(AceMQ::AMQP::ConfigurationError, /teardown takes an AceMQ::AMQP::Topology/)
  end

  it "declares what the Hash held when queue was called, not what it holds later" do
    args = { "x-max-length" => 10 }
    topology = described_class.new.queue(queue, arguments: args)
    args["x-max-length"] = 20
    topology.apply(mq)
    expect { described_class.new.queue(queue, arguments: { "x-max-length" => 10 }).apply(mq) }.not_to raise_error
  end

  it "refuses arguments with no AMQP form, naming the queue and the argument" do
    refused = lambda do |args, message|
      expect { described_class.new.queue(queue, arguments: args).apply(mq) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, message)
    end
    refused.call(3, /arguments: must be a Hash of names to values, got Integer/)
    refused.call({ "x-a" => Float::NAN }, /queue "#{queue}": x-a: NaN is not a finite number/)
    refused.call({ "x-a" => 2**64 }, /x-a: 18446744073709551616 does not fit in 64 bits/)
    refused.call({ "x-a" => Time.now }, /x-a: a Time has no AMQP form/)
    refused.call({ "x-a" => "\xff".b }, /x-a: .* is not UTF-8 text/)
    refused.call({ "x-a" => { 1 => 2 } }, /x-a: a key must be a String or a Symbol \(got Integer\)/)
    deep = (1..150).reduce([]) { |inner, _| [inner] }
    refused.call({ "x-a" => deep }, /x-a: nesting of 100 is too deep/)
  end
end
