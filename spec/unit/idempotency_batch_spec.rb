# frozen_string_literal: true

require "acemq/amqp/patterns"

# consume(batch:) hands Patterns.idempotent several deliveries at once: one
# claim and one confirm for all of them, each message decided exactly as it
# would be alone.
RSpec.describe "Patterns.idempotent in batches" do
  let(:store) { AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new(window: 3600) }
  let(:envelope) { ->(id) { AceMQ::AMQP::Envelope.new(id: id) } }
  let(:message) { ->(id, n = 0) { AceMQ::AMQP::Message.new(payload: { "n" => n }, envelope: envelope.call(id)) } }

  it "decides each message of a batch as it would alone, and runs each key once" do
    ran = []
    once = AceMQ::AMQP::Patterns.idempotent(store) do |m|
      ran << m.envelope.id
      case m.payload["n"]
      when 1 then AceMQ::AMQP::Ack.retry("later")
      when 2 then raise ArgumentError, "boom"
      else AceMQ::AMQP::Ack.accept
      end
    end
    expect(once.call(message.call("done"))).to be_accept
    batch = [message.call("done"), message.call("new"), message.call("new"), message.call("retry-me", 1),
             message.call("raise-me", 2), AceMQ::AMQP::Message.new(payload: {}, envelope: envelope.call(nil))]
    results = once.call_many(batch)
    expect(results[0]).to be_accept                              # a duplicate of a confirmed key
    expect(results[1]).to be_accept                              # ran
    expect(results[2]).to be_wait                                # the same key again in one batch: in progress
    expect(results[3]).to be_retry                               # the handler's own retry
    expect(results[4]).to be_a(ArgumentError)                    # raised: handed back, key forgotten
    expect(results[5]).to be_reject
    expect(results[5].error_class).to eq("AceMQ::AMQP::FatalError")
    expect(ran).to eq(%w[done new retry-me raise-me])
    expect(store.confirmed?("new")).to be(true)
    expect(store.first_time?("retry-me")).to be(true)            # forgotten, so its retry runs
    expect(store.first_time?("raise-me")).to be(true)
    expect(once.call(message.call("new"))).to be_accept          # and now a plain duplicate
  end

  it "is what consume(batch:) uses, and acknowledges after the keys are confirmed" do
    mq = AceMQ::AMQP::Connection.open(memory_url)
    q = unique("batch")
    AceMQ::AMQP::Topology.new.queue(q).apply(mq)
    calls = Queue.new
    handler = AceMQ::AMQP::Patterns.idempotent(store) { |m| calls << m.payload["n"]; AceMQ::AMQP::Ack.accept }
    expect(handler).to receive(:call_many).at_least(:once).and_call_original
    envelopes = Array.new(20) { AceMQ::AMQP::Envelope.new }
    mq.batch { |b| (envelopes + envelopes).each_with_index { |e, i| b.publish({ "n" => i % 20 }, to: q, envelope: e) } }
    sub = mq.consume(q, prefetch: 50, batch: 25, &handler)
    eventually { sub.stats[:accepted] + sub.stats[:retried] >= 40 && handler.stats[:runs] == 20 }
    mq.advance_clock(5) # retried in-progress copies come back as duplicates
    eventually { sub.stats[:accepted] == 40 }
    sub.cancel
    expect(Array.new(calls.size) { calls.pop }.sort).to eq((0...20).to_a)
    expect(envelopes.map { |e| store.confirmed?(e.id) }).to all(be(true))
  end

  it "forgets the keys of a batch whose handler thread is killed part way" do
    gate = Queue.new
    once = AceMQ::AMQP::Patterns.idempotent(store) { |_m| gate.pop; AceMQ::AMQP::Ack.accept }
    t = Thread.new { once.call_many([message.call("a"), message.call("b"), message.call("c")]) }
    Thread.pass until t.status == "sleep"
    t.kill
    t.join
    expect(once.stats).to include(runs: 3, abandoned: 3, forgotten: 3)
    expect(%w[a b c].map { |k| store.first_time?(k) }).to eq([true, true, true])
  end

  it "counts a killed handler and the ones after it as abandoned, not merely forgotten" do
    gate = Queue.new
    once = AceMQ::AMQP::Patterns.idempotent(store) do |m|
      gate.pop if m.id == "b"
      AceMQ::AMQP::Ack.accept
    end
    t = Thread.new { once.call_many([message.call("a"), message.call("b"), message.call("c")]) }
    Thread.pass until t.status == "sleep"
    t.kill
    t.join
    # a finished and was confirmed; b was killed mid-handler and c never ran.
    expect(once.stats).to include(runs: 3, confirmed: 1, abandoned: 2, forgotten: 2)
    expect(store.confirmed?("a")).to be(true)
    expect(%w[b c].map { |k| store.first_time?(k) }).to eq([true, true])
  end

  it "refuses a batch below 1" do
    mq = AceMQ::AMQP::Connection.open(memory_url)
    q = unique("q")
    AceMQ::AMQP::Topology.new.queue(q).apply(mq)
    expect { mq.consume(q, batch: 0) { AceMQ::AMQP::Ack.accept } }.to raise_error(AceMQ::AMQP::ConfigurationError, /batch/)
  end
end
