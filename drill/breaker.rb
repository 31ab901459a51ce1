# frozen_string_literal: true

# A downstream that fails for 20 s, with and without a circuit breaker
# (issue 36 part 4), while a stream of bugs runs through the same consumer
# (issue 49 part 2). Not part of `rake drill` (it takes a minute or two):
# run it against a broker when the breaker's behaviour is in question.
#
#   AMQP_URL=amqp://guest:guest@127.0.0.1:5672 ruby -Ilib drill/breaker.rb
#
# Each run: RATE messages a second are published for 2 + OUTAGE + 6 s; one
# consumer (4 threads, the default retry ladder: 5 attempts, 1-2-4-8 s)
# calls a "downstream" that takes 5 ms and fails from 2 s to 2 + OUTAGE s
# after the start (raising Downstream, an IOError); every BUG_EVERY-th
# message (default 10th) is a bug (NoMethodError) whatever the downstream
# does. Printed per run: handler calls, attempts spent on failures (copies
# to the ladder), dead-lettered (bugs, and valid messages), the time until
# every message was accepted or dead-lettered; for a breaker run each
# transition and how long after the downstream came back the breaker
# closed. RUNS (default "none,on"): none, no breaker; on, circuit_breaker
# failures: 10, within: 30, pause: PAUSE (default 60), probe: PROBE
# (default 2), on: [IOError]; all, the same without on: (every failure
# counts, bugs included: with bugs flowing it hardly ever closes, and the
# run stops at LIMIT).
$stdout.sync = true
require "acemq"

URL = ENV.fetch("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
RATE = Integer(ENV.fetch("RATE", "40"))
OUTAGE = Float(ENV.fetch("OUTAGE", "20"))
PAUSE = Float(ENV.fetch("PAUSE", "60"))
PROBE = Float(ENV.fetch("PROBE", "2"))
BUG_EVERY = Integer(ENV.fetch("BUG_EVERY", "10"))
RUNS = ENV.fetch("RUNS", "none,on").split(",")
LIMIT = 120

# The downstream's error.
class Downstream < IOError; end

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
  bugs = 0
  lock = Mutex.new
  sub = mq.consume(queue, concurrency: 4, circuit_breaker: breaker) do |message|
    sleep 0.005
    at = now - t0
    down = at >= 2 && at < 2 + OUTAGE
    bug = (message.payload["n"] % BUG_EVERY) == BUG_EVERY / 2
    lock.synchronize do
      calls += 1
      if bug
        bugs += 1
      elsif down
        failures_in_outage += 1
      else
        accepted[message.payload["n"]] = true
      end
    end
    nil.total if bug
    raise Downstream, "downstream: 503 Service Unavailable" if down

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
  bug_messages = (0...published).count { |n| (n % BUG_EVERY) == BUG_EVERY / 2 }
  { label: label, published: published, calls: calls, failed_calls: failures_in_outage, bug_calls: bugs,
    retried: stats[:retried], dead_lettered: dlq, bugs: bug_messages, accepted: accepted.size, took: took,
    transitions: transitions }
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
  puts format("%-8s calls %5d (downstream failed %4d, bugs %4d)  attempts spent %4d  dead-lettered %4d (%d bugs, %d valid)  " \
              "accepted %4d of %d valid  in %.1f s",
              r[:label], r[:calls], r[:failed_calls], r[:bug_calls], r[:retried], r[:dead_lettered], r[:bugs],
              r[:dead_lettered] - r[:bugs], r[:accepted], r[:published] - r[:bugs], r[:took])
  r[:transitions].each { |at, state, reason| puts format("    %6.2f s  %-18s %s", at, state, reason) }
  closed = r[:transitions].find { |at, state, _| state.to_s == "circuit_closed" && at >= 2 + OUTAGE }
  puts format("    closed %.2f s after the downstream came back", closed[0] - (2 + OUTAGE)) if closed
end

puts "acemq #{AceMQ::VERSION}, #{RATE} messages/s, downstream down from 2 s to #{2 + OUTAGE} s, a bug every " \
     "#{BUG_EVERY} messages, breaker failures: 10, within: 30, pause: #{PAUSE}, probe: #{PROBE}"
BREAKERS = { "none" => nil, "on" => { failures: 10, within: 30, pause: PAUSE, probe: PROBE, on: [IOError] },
             "all" => { failures: 10, within: 30, pause: PAUSE, probe: PROBE } }.freeze
RUNS.each { |label| report(run(label, BREAKERS.fetch(label))) }
