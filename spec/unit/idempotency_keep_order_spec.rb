# frozen_string_literal: true

require "acemq/amqp/patterns"

# A consumer whose order matters (a partition) meets a key another worker
# claims, as after a runner was killed mid-handler: with keep_order the
# guard holds the message in place until the claim is settled, instead of
# sending it round the ladder behind later messages of its key
# (docs/ordering.md, "A runner dies under the idempotent guard").
RSpec.describe "Patterns.idempotent(keep_order: true)" do
  let(:store) { AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new(window: 3600, claim_timeout: 30) }
  let(:message) { ->(id) { AceMQ::AMQP::Message.new(payload: {}, envelope: AceMQ::AMQP::Envelope.new(id: id)) } }
  let(:ran) { [] }
  let(:guard) do
    ran = self.ran
    AceMQ::AMQP::Patterns.idempotent(store, keep_order: true) do |m|
      ran << m.envelope.id
      AceMQ::AMQP::Ack.accept
    end
  end

  # Handle `id` on a thread while its key is claimed elsewhere; once the
  # guard has looked and found the claim, `settle` the other worker's claim.
  def held(id, &settle)
    handling = Thread.new { guard.call(message.call(id)) }
    eventually { guard.stats[:held] > held_before }
    settle.call
    handling.value
  end

  let(:held_before) { 0 }

  it "accepts the message unrun once the other worker confirms its claim" do
    expect(store.first_time?("k")).to be(true)
    ack = held("k") { store.confirm("k") }
    expect(ack).to be_accept
    expect(ran).to be_empty
    expect(guard.stats).to include(held: 1, in_progress: 1, duplicates: 1, runs: 0)
  end

  it "runs the message in place once the other worker's claim is forgotten" do
    expect(store.first_time?("j")).to be(true)
    ack = held("j") { store.forget("j") }
    expect(ack).to be_accept
    expect(ran).to eq(["j"])
    expect(store.confirmed?("j")).to be(true)
    expect(guard.stats).to include(held: 1, runs: 1)
  end

  it "sends it round the ladder to wait without keep_order" do
    plain = AceMQ::AMQP::Patterns.idempotent(store) { |_| AceMQ::AMQP::Ack.accept }
    expect(store.first_time?("k")).to be(true)
    expect(plain.call(message.call("k"))).to be_wait
    expect(plain.stats[:held]).to eq(0)
  end

  it "is what consume(keep_order: true) turns on in a Patterns.idempotent handler" do
    mq = AceMQ::AMQP::Connection.open("memory://")
    AceMQ::AMQP::Topology.new.queue("ledger.p0").apply(mq)
    plain = AceMQ::AMQP::Patterns.idempotent(store) { |_| AceMQ::AMQP::Ack.accept }
    other = AceMQ::AMQP::Patterns.idempotent(store) { |_| AceMQ::AMQP::Ack.accept }
    subs = [mq.consume("ledger.p0", keep_order: true, &plain), mq.consume("ledger.p0", &other)]
    expect([plain.guard.keep_order?, other.guard.keep_order?]).to eq([true, false])
  ensure
    subs&.each(&:cancel)
    mq&.close
  end

  it "in a batch, holds for another worker's claim but not for a key the batch claimed itself" do
    expect(store.first_time?("other")).to be(true)
    handling = Thread.new { guard.call_many(%w[a a other b].map { |id| message.call(id) }) }
    eventually { guard.stats[:held] == 1 }
    expect(ran).to eq(["a"]) # the second "a" was not held for its own batch's claim
    store.confirm("other")
    results = handling.value
    expect(results.map { |r| r.class.name.split("::").last }).to eq(%w[Ack Ack Ack Ack])
    expect([results[0].accept?, results[1].wait?, results[2].accept?, results[3].accept?]).to eq([true, true, true, true])
    expect(ran).to eq(%w[a b])
    expect(guard.stats).to include(held: 1, runs: 2, duplicates: 1)
  end
end
