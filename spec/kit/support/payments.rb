# frozen_string_literal: true

require "socket"

# The guide's application code (seeds/000, "The idempotent consumer") has one
# home, the Rails application in spec/dummy: the model, the store and the
# consumer are loaded from there, as they are. Only the payment gateway is
# this kit's own: a spec stubs it (`allow(Payments).to receive(:charge!)`),
# so it only has to exist with the right arity.
module Payments
  class GatewayDown < StandardError; end

  def self.charge!(_order_id, _amount_cents) = nil
end

dummy = File.expand_path("../../dummy", __dir__)
%w[app/models/application_record.rb app/models/handled_message.rb app/models/active_record_idempotency_store.rb
   app/consumers/payments_consumer.rb].each { |f| require File.join(dummy, f) }
