# frozen_string_literal: true

require "acemq/amqp/patterns"

# A key that is claimed but not confirmed is somebody's handler still running
# — or one that died. The redelivery is retried, never accepted, so the work
# is not dropped with it.
RSpec.describe "Patterns.idempotent with a live claim" do
  let(:store) { AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new(window: 3600, claim_timeout: 300) }
  let(:message) { AceMQ::AMQP::Message.new(payload: {}, envelope: AceMQ::AMQP::Envelope.new(id: "m-live")) }

  it "sends round the ladder a delivery whose key another handler holds, and accepts it once that handler confirmed" do
    events = []
    subscriber = AceMQ::AMQP::Patterns.on(:in_progress) { |event, detail| events << [event, detail[:key]] }
    ran = 0
    gate = Queue.new
    handler = AceMQ::AMQP::Patterns.idempotent(store) do |_m|
      ran += 1
      gate.pop
      AceMQ::AMQP::Ack.accept
    end
    first = Thread.new { handler.call(message) }
    Thread.pass until ran == 1
    second = handler.call(message)
    expect(second).to be_wait # round the ladder without spending an attempt,
    expect(second.up_to).to eq(300.0) # for as long as the claim can live
    expect(second.reason).to include("has not finished")
    gate << :go
    expect(first.value).to be_accept
    expect(handler.call(message)).to be_accept
    expect(ran).to eq(1)
    expect(handler.stats).to include(in_progress: 1, duplicates: 1, runs: 1)
    expect(events).to eq([[:in_progress, "m-live"]])
  ensure
    AceMQ::AMQP::Patterns.off(subscriber) if subscriber
  end

  it "keeps the seed's two-state rule for a store that answers only first_time?" do
    seen = {}
    two_state = Object.new
    two_state.define_singleton_method(:first_time?) { |key| seen[key] ? false : (seen[key] = true) }
    handler = AceMQ::AMQP::Patterns.idempotent(two_state) { AceMQ::AMQP::Ack.retry("not yet") }
    expect(handler.call(message)).to be_retry
    expect(handler.call(message)).to be_accept # not first: a duplicate, as the seed's contract says
  end
end
