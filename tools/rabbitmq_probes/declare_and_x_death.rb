# frozen_string_literal: true

# Order after a give-back, x-delivery-limit on redeclaration, and x-death when a replayed copy is dead-lettered again.
# Measured on RabbitMQ 3.10.8, 4.0.5 and 4.3.6 for docs/production.md ("RabbitMQ 3.10, 4.0
# and 4.3"). Usage: ruby tools/rabbitmq_probes/declare_and_x_death.rb AMQP_URL. Makes its own probe.* queues and deletes them.
require_relative "probe"
def q!(name, args) = (c = ch; r = c.queue(name, durable: true, arguments: args); $made << name; c.close; :ok) rescue (puts "  declare #{name} #{args}: #{$!.class} #{$!.message[0, 160]}"; :err)
def qn(t) = "probe.#{t}.#{SecureRandom.hex(3)}"
def getall(c, q) = (out = []; loop { d, p, body = c.basic_get(q, manual_ack: true); break unless d; out << [d, p, body] }; out)
begin
  # order after nack multiple / close
  %w[nack-multiple channel-close].each do |how|
    q = qn("order"); q!(q, { "x-queue-type" => "quorum", "x-delivery-limit" => 100 })
    c = ch; c.confirm_select; 5.times { |i| c.default_exchange.publish("m#{i}", routing_key: q, persistent: true) }; c.wait_for_confirms
    r = ch; got = getall(r, q)
    how == "nack-multiple" ? (r.nack(got.last[0].delivery_tag, true, true); sleep 0.3) : r.close
    r2 = ch; again = getall(r2, q)
    puts "order after #{how}: #{again.map { |d, p, body| "#{body}(#{hdr(p).select { |k, _| k =~ /count/ }.values.join('/')})" }.join(' ')}"
    r2.close
  end
  # equivalence of x-delivery-limit on redeclare
  q = qn("eq"); q!(q, { "x-queue-type" => "quorum" })
  print "declared without limit; redeclare +1e9: "; p q!(q, { "x-queue-type" => "quorum", "x-delivery-limit" => 1_000_000_000 })
  print "  redeclare with 20: "; p q!(q, { "x-queue-type" => "quorum", "x-delivery-limit" => 20 })
  print "  redeclare with -1: "; p q!(q, { "x-queue-type" => "quorum", "x-delivery-limit" => -1 })
  q = qn("eq"); q!(q, { "x-queue-type" => "quorum", "x-delivery-limit" => 20 })
  print "declared with 20; redeclare 1e9: "; p q!(q, { "x-queue-type" => "quorum", "x-delivery-limit" => 1_000_000_000 })
  print "  redeclare without: "; p q!(q, { "x-queue-type" => "quorum" })
  print "declare with 2**31: "; p q!(qn("eq"), { "x-queue-type" => "quorum", "x-delivery-limit" => 2**31 })
  print "declare with 2**40: "; p q!(qn("eq"), { "x-queue-type" => "quorum", "x-delivery-limit" => 2**40 })
  # x-death when a dead letter is republished with its headers and dead-lettered again
  [["at-least-once", "reject-publish"], ["at-most-once", nil]].each do |strategy, overflow|
    q = qn("death")
    q!("#{q}.dlq", { "x-queue-type" => "quorum" })
    args = { "x-queue-type" => "quorum", "x-dead-letter-exchange" => "", "x-dead-letter-routing-key" => "#{q}.dlq", "x-dead-letter-strategy" => strategy, "x-delivery-limit" => 100 }
    args["x-overflow"] = overflow if overflow
    q!(q, args)
    c = ch; c.confirm_select
    c.default_exchange.publish("m", routing_key: q, persistent: true, headers: { "x-acemq-id" => "1" }); c.wait_for_confirms
    2.times do |round|
      d, = nil; 20.times { d, = c.basic_get(q, manual_ack: true); break if d; sleep 0.05 }
      c.reject(d.delivery_tag, false)
      dd = nil; 40.times { dd = c.basic_get("#{q}.dlq", manual_ack: true); break if dd[0]; sleep 0.05 }
      h = hdr(dd[1])
      puts "#{strategy} dead-letter ##{round + 1} headers: #{h.reject { |k, _| k == "x-acemq-id" }.inspect[0, 900]}"
      # AceMQ's replay: a copy with the same headers, to the queue, then ack
      c.default_exchange.publish("m", routing_key: q, persistent: true, headers: h); c.wait_for_confirms
      c.ack(dd[0].delivery_tag)
    end
    c.close
  end
ensure
  c = ch; $made.each { |n| c.queue_delete(n) rescue (c = ch) }; c.close rescue nil
  $b.close
end
