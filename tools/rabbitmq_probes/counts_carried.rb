# frozen_string_literal: true

# The count a message carries into a quorum DLQ, and a client's x-delivery-count.
# Measured on RabbitMQ 3.10.8, 4.0.5 and 4.3.6 for docs/production.md ("RabbitMQ 3.10, 4.0
# and 4.3"). Usage: ruby tools/rabbitmq_probes/counts_carried.rb AMQP_URL. Makes its own probe.* queues and deletes them.
require_relative "probe"
# give back via channel close until gone; count returns
def returns_until_gone(q, max)
  n = 0
  while n < max
    c = ch; d, p = get(c, q)
    return [n, "gone"] unless d
    cnt = hdr(p)["x-delivery-count"]
    c.close; n += 1; sleep 0.2
    print " #{cnt.inspect}"
  end
  [n, "still there"]
end
begin
  q = "probe.carry.#{SecureRandom.hex(3)}"
  q!("#{q}.dlq", { "x-queue-type" => "quorum", "x-delivery-limit" => 5 })
  q!(q, { "x-queue-type" => "quorum", "x-delivery-limit" => 3, "x-dead-letter-exchange" => "", "x-dead-letter-routing-key" => "#{q}.dlq" })
  c = ch; c.confirm_select; c.default_exchange.publish("m", routing_key: q, persistent: true); c.wait_for_confirms; c.close
  print "main (limit 3), count seen:"; r = returns_until_gone(q, 10); puts " -> #{r.inspect}"
  sleep 0.5
  print "dlq (limit 5), count seen:"; r = returns_until_gone("#{q}.dlq", 10); puts " -> #{r.inspect}"
  q2 = "probe.client.#{SecureRandom.hex(3)}"
  q!(q2, { "x-queue-type" => "quorum", "x-delivery-limit" => 5 })
  c = ch; c.confirm_select; c.default_exchange.publish("m", routing_key: q2, persistent: true, headers: { "x-delivery-count" => 100, "x-acquired-count" => 100 }); c.wait_for_confirms; c.close
  print "client header x-delivery-count 100 into limit 5, count seen:"; r = returns_until_gone(q2, 8); puts " -> #{r.inspect}"
ensure
  cleanup
end
