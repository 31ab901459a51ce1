# frozen_string_literal: true

return unless defined?(RSpec::Rails) # run under rspec-rails only: see rails_helper.rb

# Application code that publishes through AceMQ::Rails.publisher, as a
# controller or a model callback would.
module OrderPlacer
  def self.place(order_id)
    AceMQ::Rails.publisher.publish({ order_id: order_id }, exchange: "orders-events", to: "order.placed",
                                                           type: "order.placed.v1")
  end
end

RSpec.describe OrderPlacer do
  it "publishes order.placed on the orders exchange" do
    expect { described_class.place("A-1") }
      .to have_published("order_id" => "A-1").on("orders-events").to("order.placed").with_type("order.placed.v1")
  end

  it "lands in the queues the example declares, as in production" do
    queue = AceMQ::AMQP::Topology.new.exchange("orders-events", type: :topic).queue("shop.audit")
                                     .bind("shop.audit", to: "orders-events", routing_key: "order.*")
    acemq_declare(queue)

    described_class.place("A-1")

    expect(acemq_published.last).to be_routed
    expect(acemq_broker.queue_depth("shop.audit")).to eq(ready: 1, unacked: 0)
  end

  it "fails the example when nothing was published where it said" do
    expect do
      expect { described_class.place("A-1") }.to have_published.to("order.placed")
    end.to raise_error(RSpec::Expectations::ExpectationNotMetError,
                       /to publish once to "order.placed", but it published it 0 times/)
  end
end
