# frozen_string_literal: true

# A delivery-limit policy on a quorum queue declared without x-delivery-limit: 25 returns.
# Usage: rabbitmqctl set_policy --apply-to quorum_queues acemq-dlq '\.dlq$' '{"delivery-limit": 1000000000}'; ruby tools/rabbitmq_probes/policy.rb AMQP_URL QUEUE.dlq
require "bunny"; require "securerandom"
b = Bunny.new(ARGV[0], logger: Logger.new(nil)).tap(&:start)
q = ARGV[1]
c = b.create_channel; c.confirm_select; c.default_exchange.publish("m", routing_key: q, persistent: true); c.wait_for_confirms; c.close
n = 0
25.times do
  c = b.create_channel; d, p, = c.basic_get(q, manual_ack: true); break unless d; c.close; n += 1; sleep 0.1
end
c = b.create_channel; d, p, = c.basic_get(q, manual_ack: true)
puts "#{b.server_properties["version"]}: after #{n} returns: #{d ? "still there, x-delivery-count #{(p[:headers] || {})["x-delivery-count"]}" : "gone"}"
c.close; b.close
