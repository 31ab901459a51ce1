# frozen_string_literal: true

# A downstream that fails for 20 s, with and without a circuit breaker
# (issue 36 part 4). Not part of `rake drill` (it takes a minute): run it
# against a broker when the breaker's behaviour is in question.
#
#   AMQP_URL=amqp://guest:guest@127.0.0.1:5672 ruby -Ilib drill/breaker.rb
#
# Each run: RATE messages a second are published for 2 + OUTAGE + 6 s; one
# consumer (4 threads, the default retry ladder: 5 attempts, 1-2-4-8 s)
# calls a "downstream" that takes 5 ms and fails from 2 s to 2 + OUTAGE s
# after the start. Printed per run: handler calls, attempts spent on failures (copies
# to the ladder), dead-lettered, the time until every message was accepted;
# for the breaker run each transition and how long after the downstream came
# back the breaker closed. The breaker is circuit_breaker failures: 10,
# within: 30, pause: PAUSE (default 5 s, so a run takes about a minute).
$stdout.sync = true
require "acemq"

URL = ENV.fetch("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
RATE = Integer(ENV.fetch("RATE", "40"))
OUTAGE = Float(ENV.fetch("OUTAGE", "20"))
PAUSE = Float(ENV.fetch("PAUSE", "5"))
LIMIT = 120

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

def run(label, breaker)
  mq = AceMQ::AMQP::Connection.open(URL, origin: "drill-breaker")
  queue = "drill.breaker.#{label}.#{Process.pid}"
  AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
  transitions = []
  t0 = now
  published = 0
  publisher = Thread.new do
    until now - t0 > 2 + OUTAGE + 6
      mq.publish({ "n" => published }, to: queue)
      published += 1
      sleep 1.0 / RATE
    end
  end
  events = AceMQ.subscribe("subscription.acemq") do |e|
    transitions << [now - t0, e[:state], e[:reason]] if e[:queue] == queue && e[:state].to_s.start_with?("circuit")
  end
  calls = 0
  failures_in_outage = 0
  accepted = {}
  lock = Mutex.new
  sub = mq.consume(queue, concurrency: 4, circuit_breaker: breaker) do |message|
    sleep 0.005
    at = now - t0
    down = at >= 2 && at < 2 + OUTAGE
    lock.synchronize do
      calls += 1
      failures_in_outage += 1 if down
      accepted[message.payload["n"]] = true unless down
    end
    raise "downstream: 503 Service Unavailable" if down

    AceMQ::AMQP::Ack.accept
  end
  sleep 0.1 until (!publisher.alive? && dead(mq, queue) + accepted.size >= published) || now - t0 > LIMIT
  took = now - t0
  stats = sub.stats
  dlq = dead(mq, queue)
  sub.cancel
  AceMQ.unsubscribe(events)
  mq.close
  cleanup(queue)
  { label: label, published: published, calls: calls, failed_calls: failures_in_outage, retried: stats[:retried], dead_lettered: dlq,
    accepted: accepted.size, took: took, transitions: transitions }
end

def dead(mq, queue) = mq.queue_counts("#{queue}.dlq")&.fetch(:ready, 0).to_i

def cleanup(queue)
  require "bunny"
  b = Bunny.new(URL).tap(&:start)
  ch = b.create_channel
  [queue, "#{queue}.dlq", *[1, 2, 4, 8].map { |s| "#{queue}.retry.#{s}s" }].each { |q| ch.queue_delete(q) }
  b.close
rescue LoadError, StandardError => e
  warn("drill: queues of #{queue} left: #{e.message}")
end

def report(r)
  puts format("%-8s calls %5d (failed %4d)  attempts spent %4d  dead-lettered %4d  accepted %4d of %d  in %.1f s",
              r[:label], r[:calls], r[:failed_calls], r[:retried], r[:dead_lettered], r[:accepted], r[:published], r[:took])
  r[:transitions].each { |at, state, reason| puts format("    %6.2f s  %-18s %s", at, state, reason) }
  closed = r[:transitions].find { |at, state, _| state.to_s == "circuit_closed" && at >= 2 + OUTAGE }
  puts format("    closed %.2f s after the downstream came back", closed[0] - (2 + OUTAGE)) if closed
end

puts "acemq #{AceMQ::VERSION}, #{RATE} messages/s, downstream down from 2 s to #{2 + OUTAGE} s, " \
     "breaker failures: 10, within: 30, pause: #{PAUSE}"
report(run("none", nil))
report(run("breaker", { failures: 10, within: 30, pause: PAUSE }))
