# frozen_string_literal: true

require_relative "test_helper"

# Application code that publishes through AceMQ::Rails.publisher, as a
# controller or a model callback would. spec/kit/publishing_spec.rb is the
# RSpec version.
module OrderPlacer
  def self.place(order_id)
    AceMQ::Rails.publisher.publish({ order_id: order_id }, exchange: "orders-events", to: "order.placed",
                                                           type: "order.placed.v1")
  end
end

class OrderPlacerTest < ActiveSupport::TestCase
  test "publishes order.placed on the orders exchange" do
    assert_published({ "order_id" => "A-1" }, on: "orders-events", to: "order.placed", type: "order.placed.v1") do
      OrderPlacer.place("A-1")
    end
  end

  test "lands in the queues the test declares, as in production" do
    acemq_declare(AceMQ::AMQP::Topology.new.exchange("orders-events", type: :topic).queue("shop.audit")
                                       .bind("shop.audit", to: "orders-events", routing_key: "order.*"))

    OrderPlacer.place("A-1")

    assert_predicate acemq_published.last, :routed?
    assert_equal({ ready: 1, unacked: 0 }, acemq_broker.queue_depth("shop.audit"))
  end

  test "fails the test when nothing was published where it said, with what was" do
    error = assert_raises(Minitest::Assertion) do
      assert_published(to: "order.placed") { OrderPlacer.place("A-1") }
    end

    assert_equal <<~TEXT.chomp, error.message
      expected the block to publish once to "order.placed", but it published it 0 times.
      Published (1):
        on "orders-events" to "order.placed" type="order.placed.v1" payload=#{{ 'order_id' => 'A-1' }.inspect} (unrouted: nothing in this test takes it)
    TEXT
  end
end

# An integration test whose publisher must be the application's own.
class OrderPlacerWithoutTheKitTest < ActiveSupport::TestCase
  acemq false

  test "leaves AceMQ::Rails.publisher alone" do
    assert_nil AceMQ::Testing::Harness.current
    refute_instance_of AceMQ::Testing::RecordingPublisher, AceMQ::Rails.current_publisher
  end
end
