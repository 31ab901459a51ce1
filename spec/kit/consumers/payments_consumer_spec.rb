# frozen_string_literal: true

return unless defined?(RSpec::Rails) # run under rspec-rails only: see ../rails_helper.rb

# The guide's consumer spec as printed, but for one line: the guide's
# `expect(Payments).to have_received(:charge!)` needs Payments to be a spy,
# and the guide leaves out the `allow` that makes it one.
RSpec.describe PaymentsConsumer do
  let(:store) { AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new }
  let(:message) do
    AceMQ::AMQP::Message.new(
      payload: { "order_id" => "A-1", "amount_cents" => 1299 },
      envelope: AceMQ::AMQP::Envelope.new(id: "m-1", type: "payment.due.v1")
    )
  end

  before { allow(Payments).to receive(:charge!) }

  it "charges once however many times the broker delivers it" do
    consumer = described_class.new
    stub_const("#{described_class}::STORE", store)

    3.times { expect(consumer.call(message)).to be_accept }

    expect(Payments).to have_received(:charge!).once
  end
end
