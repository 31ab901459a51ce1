# frozen_string_literal: true

# consumer_timeout on a classic and a quorum queue (a node started with consumer_timeout = 2000; waits up to 75 s each).
# Measured on RabbitMQ 3.10.8, 4.0.5 and 4.3.6 for docs/production.md ("RabbitMQ 3.10, 4.0
# and 4.3"). Usage: ruby tools/rabbitmq_probes/consumer_timeout.rb AMQP_URL. Makes its own probe.* queues and deletes them.
require "bunny"; require "securerandom"
URL = ARGV[0]
b = Bunny.new(URL, logger: Logger.new(nil)).tap(&:start)
puts "server: #{b.server_properties["version"]}"
made = []
%w[classic quorum].each do |type|
  q = "probe.ct.#{type}.#{SecureRandom.hex(3)}"; made << q
  c0 = b.create_channel; c0.queue(q, durable: true, arguments: { "x-queue-type" => type }); c0.confirm_select
  c0.default_exchange.publish("m", routing_key: q, persistent: true); c0.wait_for_confirms
  ch = b.create_channel; ch.prefetch(1)
  events = Queue.new; t0 = Time.now
  cons = ch.queue(q, passive: true).subscribe(manual_ack: true) { |d, p, _| events << [:delivery, (Time.now - t0).round(1), d.redelivered?, (p.headers || {}).select { |k, _| k =~ /count/ }] }
  cons.on_cancellation { events << [:basic_cancel, (Time.now - t0).round(1)] }
  ch.on_error { |_c, close| events << [:channel_closed, (Time.now - t0).round(1), close.reply_code, close.reply_text] }
  seen = []
  deadline = Time.now + 75
  while Time.now < deadline
    e = (events.pop(true) rescue nil)
    (sleep 0.1; next) unless e
    seen << e
    break if seen.size >= 3 || (e[0] == :channel_closed)
  end
  sleep 1
  seen << events.pop while !events.empty?
  puts "#{type}: #{seen.inspect}; channel open=#{ch.open?}"
  c2 = b.create_channel; d, p, = c2.basic_get(q, manual_ack: true); puts "  after: basic_get on a fresh channel -> #{d ? "got it (redelivered=#{d.redelivered}, #{(p[:headers] || {}).inspect})" : "nothing"}"; c2.close rescue nil
  ch.close rescue nil
end
c = b.create_channel; made.each { |n| c.queue_delete(n) rescue (c = b.create_channel) }; b.close
