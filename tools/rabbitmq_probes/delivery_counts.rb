# frozen_string_literal: true

# What counts toward a quorum queue's delivery limit, the default limit, and x-delivery-limit -1.
# Measured on RabbitMQ 3.10.8, 4.0.5 and 4.3.6 for docs/production.md ("RabbitMQ 3.10, 4.0
# and 4.3"). Usage: ruby tools/rabbitmq_probes/delivery_counts.rb AMQP_URL. Makes its own probe.* queues and deletes them.
require "bunny"
require "securerandom"
URL = ARGV[0] || "amqp://guest:guest@127.0.0.1:5672"
b = Bunny.new(URL, logger: Logger.new(nil)).tap(&:start)
puts "server: #{b.server_properties["version"]} product #{b.server_properties["product"]}"
ch = b.create_channel
$made = []
def q!(ch, name, args) = ($made << name; ch.queue(name, durable: true, arguments: args))
def qname(tag) = "probe.#{tag}.#{SecureRandom.hex(3)}"
def get(ch, q) = 20.times { d, p, body = ch.basic_get(q, manual_ack: true); return [d, p, body] if d; sleep 0.05 } && nil
def depth(b, q) = b.create_channel.then { |c| n = c.queue(q, passive: true).message_count; c.close; n }

def setup(b, ch, tag, limit)
  name = qname(tag)
  args = { "x-queue-type" => "quorum", "x-dead-letter-exchange" => "", "x-dead-letter-routing-key" => "#{name}.dlq" }
  args["x-delivery-limit"] = limit unless limit.nil?
  q!(ch, "#{name}.dlq", { "x-queue-type" => "quorum" })
  q!(ch, name, args)
  ch.default_exchange.publish("m", routing_key: name, persistent: true)
  sleep 0.2
  name
end

# what counts: each op done once, then the count header read
ops = {
  "nack-requeue" => ->(b, ch, q) { d, = get(ch, q); ch.nack(d.delivery_tag, false, true) },
  "reject-requeue" => ->(b, ch, q) { d, = get(ch, q); ch.reject(d.delivery_tag, true) },
  "channel-close" => ->(b, ch, q) { c = b.create_channel; d, = get(c, q); c.close },
  "consumer-cancel+close" => ->(b, ch, q) { c = b.create_channel; got = Queue.new; cons = c.queue(q, passive: true).subscribe(manual_ack: true) { |d, _, _| got << d }; got.pop; cons.cancel; sleep 0.3; c.close },
  "consumer-cancel-only(then nack)" => ->(b, ch, q) { c = b.create_channel; got = Queue.new; cons = c.queue(q, passive: true).subscribe(manual_ack: true) { |d, _, _| got << d }; d = got.pop; cons.cancel; sleep 0.3; c.nack(d.delivery_tag, false, true); sleep 0.2; c.close },
}
ops.each do |label, op|
  q = setup(b, ch, "ops", 100)
  counts = []
  3.times do
    op.call(b, ch, q); sleep 0.3
    d, p, = get(ch, q)
    h = d ? (p.is_a?(Hash) ? p[:headers] : p.headers) || {} : nil; counts << (d ? h.select { |k, _| k =~ /count/ }.map { |k, v| "#{k.sub("x-","")}=#{v}" }.join(",") + (d.redelivered ? "/r" : "") : "GONE")
    ch.nack(d.delivery_tag, false, true) if d   # give it back again (this nack itself may count)
    sleep 0.2
  end
  puts "#{label}: header after op, op+nack, op+nack+...: #{counts.join(' ')}"
end

def limit_run(b, ch, label, limit, op, max: 30)
  q = setup(b, ch, "lim", limit)
  n = 0
  while n < max
    break if depth(b, "#{q}.dlq") > 0 || depth(b, q) == 0 && (sleep(0.5); depth(b, "#{q}.dlq") > 0 || depth(b, q) == 0)
    op.call(b, ch, q)
    n += 1
    sleep 0.15
  end
  sleep 0.5
  puts "limit #{limit.inspect} #{label}: returns done=#{n}, main=#{depth(b, q)} dlq=#{depth(b, "#{q}.dlq")}"
end
limit_run(b, ch, "nack-requeue", 1, ops["nack-requeue"])
limit_run(b, ch, "reject-requeue", 1, ops["reject-requeue"])
limit_run(b, ch, "channel-close", 1, ops["channel-close"])
limit_run(b, ch, "nack-requeue", -1, ops["nack-requeue"], max: 3)
limit_run(b, ch, "channel-close", -1, ops["channel-close"], max: 3)
limit_run(b, ch, "nack-requeue (no arg: default)", nil, ops["nack-requeue"], max: 25)
limit_run(b, ch, "channel-close (no arg: default)", nil, ops["channel-close"], max: 25)
c = b.create_channel; $made.each { |n| (c.queue_delete(n) rescue c = b.create_channel) }; b.close
