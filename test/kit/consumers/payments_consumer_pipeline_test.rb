# frozen_string_literal: true

require_relative "../test_helper"

# The same consumer through its whole pipeline on the test's memory://
# broker, with the guide's ActiveRecord store on the test's transactional
# database: the handler runs on the consumer's own thread, and Rails lends
# that thread the test's connection, so the claim rows are visible here and
# rolled back with the test. spec/kit/consumers/payments_consumer_pipeline_spec.rb
# is the RSpec version.
class PaymentsConsumerPipelineTest < ActiveSupport::TestCase
  setup do
    @payload = { "order_id" => "A-1", "amount_cents" => 1299 }
  end

  test "runs on Rails, in a transaction, with the kit in ActiveSupport::TestCase" do
    assert_includes self.class.ancestors, AceMQ::Minitest::Helpers
    assert_includes self.class.ancestors, ActiveRecord::TestFixtures
    assert_predicate ActiveRecord::Base.connection, :transaction_open?
    assert_instance_of AceMQ::Testing::RecordingPublisher, AceMQ::Rails.publisher
    puts "\nminitest #{Minitest::VERSION} on Rails #{Rails.version}" if ENV["ACEMQ_KIT_VERSIONS"]
  end

  test "charges once when the broker delivers the same message three times" do
    charges = record_charges

    outcomes = Array.new(3) { deliver(PaymentsConsumer, @payload, id: "m-1", type: "payment.due.v1") }

    assert_equal %i[accepted duplicate duplicate], outcomes.map(&:kind)
    outcomes.each { |outcome| assert_accepted outcome }
    assert_equal [["A-1", 1299]], Array.new(charges.size) { charges.pop }
    assert_equal "CONFIRMED", HandledMessage.find("m-1").state
  end

  test "walks a gateway outage up the ladder to the DLQ, and forgets the claim each time" do
    charges = record_charges(raising: Payments::GatewayDown.new("gateway down"))

    first = assert_retried deliver(PaymentsConsumer, @payload, id: "m-2")
    assert_equal 1, first.rung
    assert_empty HandledMessage.where(message_id: "m-2")

    last = assert_dead_lettered first.last_attempt
    assert_equal "retries exhausted after 5 attempts: Payments::GatewayDown: gateway down", last.reason
    assert_equal %i[retried retried retried retried dead_lettered], last.history.map(&:kind)
    assert_equal 5, charges.size
    assert_equal({ ready: 1, unacked: 0 }, acemq_broker.queue_depth("shop.payments.dlq"))
  end
end
