# frozen_string_literal: true

return unless defined?(RSpec::Rails) # run under rspec-rails only: see ../rails_helper.rb

# The same consumer through its whole pipeline on the example's memory://
# broker, with the guide's ActiveRecord store on the example's transactional
# database: the handler runs on the consumer's own thread, and Rails lends
# that thread the example's connection, so the claim rows are visible here
# and rolled back with the example.
RSpec.describe PaymentsConsumer do
  let(:payload) { { "order_id" => "A-1", "amount_cents" => 1299 } }

  before { allow(Payments).to receive(:charge!) }

  it "runs under rspec-rails #{RSpec::Rails::Version::STRING} on Rails #{Rails.version}, in a transaction" do
    expect(self.class.ancestors).to include(RSpec::Rails::FixtureSupport)
    expect(ActiveRecord::Base.connection.transaction_open?).to be(true)
  end

  it "charges once when the broker delivers the same message three times" do
    outcomes = Array.new(3) { deliver(described_class, payload, id: "m-1", type: "payment.due.v1") }

    expect(outcomes.map(&:kind)).to eq(%i[accepted duplicate duplicate])
    expect(outcomes).to all(be_accepted)
    expect(Payments).to have_received(:charge!).with("A-1", 1299).once
    expect(HandledMessage.find("m-1").state).to eq("CONFIRMED")
  end

  it "walks a gateway outage up the ladder to the DLQ, and forgets the claim each time" do
    allow(Payments).to receive(:charge!).and_raise(Payments::GatewayDown, "gateway down")

    first = deliver(described_class, payload, id: "m-2")
    expect(first).to be_retried
    expect(first.rung).to eq(1)
    expect(HandledMessage.where(message_id: "m-2")).to be_empty

    last = first.last_attempt
    expect(last).to be_dead_lettered
    expect(last.reason).to eq("retries exhausted after 5 attempts: Payments::GatewayDown: gateway down")
    expect(last.history.map(&:kind)).to eq(%i[retried retried retried retried dead_lettered])
    expect(Payments).to have_received(:charge!).exactly(5).times
    expect(acemq_broker.queue_depth("shop.payments.dlq")).to eq(ready: 1, unacked: 0)
  end
end
