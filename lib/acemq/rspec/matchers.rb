# frozen_string_literal: true

require "acemq/rspec/have_published"

module AceMQ
  module RSpec
    # Included into example groups by `require "acemq/rspec"`.
    module Matchers
      # What the code published through AceMQ::Rails.publisher:
      #
      #   expect { OrderPlacer.call(order) }
      #     .to have_published(hash_including("order_id" => order.id)).on("orders-events").to("order.placed")
      #
      #   expect { deliver(OrdersConsumer, payload) }.to have_published.to("shop.shipping").with_type("shipment.due.v1")
      #   expect(acemq_publisher).to have_published(anything).twice
      #
      # payload: a value or a matcher, against the payload as published or as
      # a consumer will receive it. .to(name): the queue (through the default
      # exchange) or, after .on(exchange), the routing key. .with_type,
      # .with_headers. Exactly once unless a count says otherwise (.twice,
      # .exactly(n).times, .at_least(n).times, .at_most(n).times): a publish
      # made twice is the double charge this library exists to prevent.
      #
      # The block form counts what was published by the time the block
      # returned. A publish that raised (a payload that is not JSON) never
      # counts, and the failure message lists it; one that nothing in the
      # example's broker routes does count, because production's queues are
      # production's to declare (Published#routed? tells them apart).
      def have_published(*payload) = HavePublished.new(*payload)
    end
  end
end
