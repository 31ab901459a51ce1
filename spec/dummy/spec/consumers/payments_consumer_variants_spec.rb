# frozen_string_literal: true

# The guide's two other shapes of PaymentsConsumer#once, each in a subclass
# with the guide's method body as printed: keyed on the business event
# ("Which key"), and the charge and the confirm in one transaction ("The
# transaction question"). A class body rather than Class.new, so STORE and
# accept resolve inside them as they do in the guide's class.
class KeyedPaymentsConsumer < PaymentsConsumer
  private

  def once
    @once ||= AceMQ::AMQP::Patterns.idempotent(STORE, key: ->(m) { "charge:#{m.payload["order_id"]}" }) do |m|
      Payments.charge!(m.payload["order_id"], m.payload["amount_cents"])
      accept
    end
  end
end

class TransactionalPaymentsConsumer < PaymentsConsumer
  private

  def once
    @once ||= AceMQ::AMQP::Patterns.idempotent(STORE) do |m|
      # The claim is already committed by the time this block runs — `first_time?`
      # is its own INSERT, deliberately, because a claim inside the handler's
      # transaction is a claim that rolls back with it and stops being a claim.
      ActiveRecord::Base.transaction do
        Payments.charge!(m.payload["order_id"], m.payload["amount_cents"])
        STORE.confirm(m.envelope.id)
      end
      accept
    end
  end
end

RSpec.describe "The guide's PaymentsConsumer variants, on the application's database" do
  def delivery(order_id)
    AceMQ::AMQP::Message.new(
      payload: { "order_id" => order_id, "amount_cents" => 1299 },
      envelope: AceMQ::AMQP::Envelope.new(type: "payment.due.v1")
    )
  end

  it "keyed on the order: two publishes of one order (a double click) are one charge" do
    consumer = KeyedPaymentsConsumer.new

    2.times { expect(consumer.call(delivery("K-1"))).to be_accept }

    expect(Payments.charges_for("K-1")).to eq(1)
    expect(HandledMessage.find("charge:K-1")).to have_attributes(state: "CONFIRMED")
  end

  it "with the confirm in the charge's transaction: CONFIRMED with the charge, and a duplicate is not charged" do
    consumer = TransactionalPaymentsConsumer.new
    message = delivery("T-1")

    2.times { expect(consumer.call(message)).to be_accept }

    expect(Payments.charges_for("T-1")).to eq(1)
    expect(HandledMessage.find(message.envelope.id)).to have_attributes(state: "CONFIRMED")
  end

  it "with the confirm in the charge's transaction: a charge that fails rolls back and leaves no key" do
    consumer = TransactionalPaymentsConsumer.new
    message = delivery("T-2")
    allow(Charge).to receive(:create!).and_raise(ActiveRecord::RecordInvalid)

    expect { consumer.call(message) }.to raise_error(ActiveRecord::RecordInvalid)

    expect(HandledMessage.where(message_id: message.envelope.id)).to be_empty
  end
end
