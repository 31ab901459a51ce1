# frozen_string_literal: true

# A message past the DLQ's own limit on arrival, given back by nack or close; a client's x-death on a publish.
# Measured on RabbitMQ 3.10.8, 4.0.5 and 4.3.6 for docs/production.md ("RabbitMQ 3.10, 4.0
# and 4.3"). Usage: ruby tools/rabbitmq_probes/over_limit_on_arrival.rb AMQP_URL. Makes its own probe.* queues and deletes them.
require_relative "probe"
begin
  [[5, :nack], [2, :nack], [2, :close]].each do |dlq_limit, how|
    q = "probe.over.#{SecureRandom.hex(3)}"
    q!("#{q}.dlq", { "x-queue-type" => "quorum", "x-delivery-limit" => dlq_limit })
    q!(q, { "x-queue-type" => "quorum", "x-delivery-limit" => 3, "x-dead-letter-exchange" => "", "x-dead-letter-routing-key" => "#{q}.dlq" })
    c = ch; c.confirm_select; c.default_exchange.publish("m", routing_key: q, persistent: true); c.wait_for_confirms; c.close
    4.times { c = ch; get(c, q); c.close; sleep 0.1 }
    sleep 0.5
    seen = []
    8.times do
      c = ch; d, p = get(c, "#{q}.dlq")
      (seen << "gone"; c.close; break) unless d
      seen << hdr(p)["x-delivery-count"].inspect
      how == :nack ? (c.nack(d.delivery_tag, false, true); sleep 0.1; c.close) : c.close
      sleep 0.15
    end
    puts "dlq limit #{dlq_limit}, arrived after 4 returns of main (limit 3), give back by #{how}: #{seen.join(' ')}"
  end
  # a client's x-death on a plain publish: kept?
  q = "probe.xd.#{SecureRandom.hex(3)}"; q!(q, { "x-queue-type" => "quorum" })
  c = ch; c.confirm_select
  c.default_exchange.publish("m", routing_key: q, persistent: true, headers: { "x-death" => [{ "count" => 1, "reason" => "delivery_limit", "queue" => "orig", "time" => Time.at(1_700_000_000), "exchange" => "", "routing-keys" => ["orig"] }], "x-first-death-reason" => "delivery_limit", "x-first-death-queue" => "orig", "x-last-death-reason" => "delivery_limit", "x-last-death-queue" => "orig", "x-mine" => "kept" })
  c.wait_for_confirms
  d, p = get(c, q); puts "client x-death republished, headers seen: #{hdr(p).inspect[0, 600]}"; c.close
ensure
  cleanup
end
