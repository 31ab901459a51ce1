# frozen_string_literal: true

# The guide's store, on this app's acemq_idempotency table.
RSpec.describe ActiveRecordIdempotencyStore do
  subject(:store) { described_class.new(worker: "spec:1") }

  it "answers true once: the claim is the INSERT" do
    expect(store.first_time?("k-1")).to be(true)
    expect(store.first_time?("k-1")).to be(false)
    expect(described_class.new(worker: "spec:2").first_time?("k-1")).to be(false)
  end

  it "lets another worker take over a claim gone stale, never a CONFIRMED key" do
    store.first_time?("stale")
    store.first_time?("done")
    store.confirm("done")
    HandledMessage.update_all(recorded_at: Time.now.utc - described_class::CLAIM_TIMEOUT - 1)

    other = described_class.new(worker: "spec:2")
    expect(other.first_time?("stale")).to be(true)
    expect(HandledMessage.find("stale").claimed_by).to eq("spec:2")
    expect(other.first_time?("done")).to be(false)
  end

  it "forgets only its own CLAIMED key" do
    store.first_time?("mine")
    described_class.new(worker: "spec:2").forget("mine")
    expect(HandledMessage.exists?("mine")).to be(true)

    store.forget("mine")
    expect(HandledMessage.exists?("mine")).to be(false)
  end

  it "purges keys past their retention and nothing else" do
    store.first_time?("old")
    store.first_time?("new")
    HandledMessage.where(message_id: "old").update_all(expires_at: Time.now.utc - 1)

    expect(store.purge_expired).to eq(1)
    expect(HandledMessage.where(message_id: %w[old new]).pluck(:message_id)).to eq(["new"])
  end
end
