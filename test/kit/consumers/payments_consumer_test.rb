# frozen_string_literal: true

require_relative "../test_helper"

# The guide's consumer spec (seeds/000, "The idempotent consumer"; the RSpec
# version is spec/kit/consumers/payments_consumer_spec.rb) in Minitest: no
# broker, the consumer called three times with one message, one charge.
class PaymentsConsumerTest < ActiveSupport::TestCase
  setup do
    @store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new
    @message = AceMQ::AMQP::Message.new(
      payload: { "order_id" => "A-1", "amount_cents" => 1299 },
      envelope: AceMQ::AMQP::Envelope.new(id: "m-1", type: "payment.due.v1")
    )
    @charges = record_charges
  end

  test "charges once however many times the broker delivers it" do
    consumer = PaymentsConsumer.new
    stub_const(PaymentsConsumer, :STORE, @store)

    3.times { assert_predicate consumer.call(@message), :accept? }

    assert_equal 1, @charges.size
  end
end
