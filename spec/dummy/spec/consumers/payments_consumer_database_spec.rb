# frozen_string_literal: true

# The guide's PaymentsConsumer with the store it ships with (the guide's
# ActiveRecordIdempotencyStore on acemq_idempotency), against this app's
# database: SQLite, or PostgreSQL when DATABASE_URL is set.
RSpec.describe PaymentsConsumer, "on the application's database" do
  # A new message id each call, as a publisher generates one.
  def delivery(order_id)
    AceMQ::AMQP::Message.new(
      payload: { "order_id" => order_id, "amount_cents" => 1299 },
      envelope: AceMQ::AMQP::Envelope.new(type: "payment.due.v1")
    )
  end

  it "charges once for three deliveries of one message, and the key is CONFIRMED" do
    consumer = described_class.new
    message = delivery("A-2")

    3.times { expect(consumer.call(message)).to be_accept }

    expect(Payments.charges_for("A-2")).to eq(1)
    expect(HandledMessage.find(message.envelope.id)).to have_attributes(state: "CONFIRMED")
  end

  it "charges again for a second message id: two publishes are two messages" do
    consumer = described_class.new

    2.times { expect(consumer.call(delivery("A-3"))).to be_accept }

    expect(Payments.charges_for("A-3")).to eq(2)
  end

  it "forgets the claim when the charge fails, so the retry charges" do
    consumer = described_class.new
    message = delivery("A-4")
    calls = 0
    allow(Payments).to receive(:charge!).and_wrap_original do |charge, *args|
      calls += 1
      raise "gateway timeout" if calls == 1

      charge.call(*args)
    end

    # The guard lets the error through (the subscription makes it a retry)
    # after forgetting the key.
    expect { consumer.call(message) }.to raise_error(RuntimeError, "gateway timeout")
    expect(HandledMessage.where(message_id: message.envelope.id)).to be_empty

    expect(consumer.call(message)).to be_accept
    expect(Payments.charges_for("A-4")).to eq(1)
  end
end
