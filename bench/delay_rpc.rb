# frozen_string_literal: true

# Issue 35's benchmarks, on RabbitMQ at AMQP_URL (rake bench runs this):
#
# 1. delayed publish (delay: 1, into the cascade) against plain publish, each
#    confirmed one by one, alternated, medians of BENCH_RUNS;
# 2. the wall-clock accuracy of a delay: 1,000 messages a second for
#    BENCH_DELAY_SECONDS (default 60) with delays spread evenly over 1..60 s;
#    lateness = arrival minus the due time each carries (x-acemq-due), p50/p99;
# 3. request/reply round trips per second, the gem's Connection#request from 1
#    thread and from 8, against raw lapin doing the same over direct reply-to
#    (core/examples/bench_rpc.rs raw_rpc: mandatory, confirmed, confirm and
#    reply awaited together), 1 and 8 in flight; both against one raw-lapin
#    responder process. Target >= 0.90x.
require_relative "common"
$stdout.sync = true
require "acemq/amqp"

RPC = File.expand_path("../target/release/examples/bench_rpc", __dir__)
# Built here (a no-op when it is current): rake bench builds only `bench`.
system("cargo", "build", "--locked", "--release", "-q", "-p", "acemq", "--example", "bench_rpc", exception: true)

mq = AceMQ::AMQP::Connection.open(BenchCommon::URL)
tag = SecureRandom.hex(4)
names = []
queue = lambda do |name|
  q = "acemq-bench-delay-#{name}-#{tag}"
  AceMQ::AMQP::Topology.new.queue(q).apply(mq)
  names << q
  q
end
payload = BenchCommon.payload(0)
BenchCommon.banner("delayed publish, accuracy, request/reply (issue 35)")
load1 = File.read("/proc/loadavg").split.first
puts "  load average at start: #{load1} (2 cores)"

# 1. Delayed publish vs plain publish.
n = BenchCommon.count(2000)
plain_q = queue.call("plain")
quorum_q = "acemq-bench-delay-quorum-#{tag}"
AceMQ::AMQP::Topology.new.queue(quorum_q, type: :quorum).apply(mq)
names << quorum_q
delayed_q = queue.call("delayed")
got = Queue.new
delivered = 0
sub = mq.consume(delayed_q, concurrency: 2, prefetch: 200) { |_m| got << 1; AceMQ::AMQP::Ack.accept }
mq.publish(payload, to: delayed_q, delay: 1) # the cascade and the binding declared outside the clock
got.pop
rates = BenchCommon.alternate(n, {
  plain: -> { BenchCommon.time { n.times { mq.publish(payload, to: plain_q) } } },
  delayed: -> { BenchCommon.time { n.times { mq.publish(payload, to: delayed_q, delay: 1) } } },
  # What a level holds it in: a quorum queue (the bound of the row above).
  quorum: -> { BenchCommon.time { n.times { mq.publish(payload, to: quorum_q) } } }
})
puts format("  publish each: plain (classic queue) %.0f/s, delayed %.0f/s, plain to a quorum queue %.0f/s",
            rates[:plain], rates[:delayed], rates[:quorum])
BenchCommon::Table.ratio(path: "delayed publish vs plain publish to a quorum queue (a level's type)", ours: rates[:delayed],
                         base: rates[:quorum], target: 0.9, base_name: "quorum")
BenchCommon::Table.ratio(path: "delayed publish (delay: 1) vs plain publish, each confirmed", ours: rates[:delayed],
                         base: rates[:plain], target: 0.9, base_name: "plain",
                         bound: "one more exchange hop and exchange-to-exchange binding per message")
# Every delayed message arrives before its queue goes (a delay to a deleted
# queue would wait in acemq.delay.00: docs/delays.md).
(BenchCommon::RUNS * n).times { got.pop }
sub.cancel

# 2. Accuracy: 1,000/s over the window, delays 1..60 s spread evenly.
window = Integer(ENV.fetch("BENCH_DELAY_SECONDS", "60"))
rate = 1000
acc_q = queue.call("accuracy")
late = Queue.new
sub = mq.consume(acc_q, concurrency: 4, prefetch: 500) do |m|
  now_ms = (Time.now.to_f * 1000).round
  late << (now_ms - m.headers["x-acemq-due"]) / 1000.0
  AceMQ::AMQP::Ack.accept
end
total = window * rate
started = BenchCommon.now
sent = 0
while sent < total
  target = ((BenchCommon.now - started) * rate).floor.clamp(0, total)
  mq.batch { |b| (sent...target).each { |i| b.publish({ "i" => i }, to: acc_q, delay: 1 + (i % 60)) } } if target > sent
  sent = target
  sleep 0.005
end
publish_seconds = BenchCommon.now - started
puts format("  accuracy: published %d in %.1f s (%.0f/s), waiting for the last to fire", total, publish_seconds,
            total / publish_seconds)
deadline = BenchCommon.now + 180
lateness = Array.new(total) do
  begin
    late.pop(true)
  rescue ThreadError
    raise "a delayed message did not arrive within 180 s" if BenchCommon.now > deadline

    sleep 0.01
    retry
  end
end.sort
sub.cancel
p50 = lateness[(lateness.size * 0.50).floor]
p99 = lateness[(lateness.size * 0.99).floor]
early = lateness.count(&:negative?)
puts format("  lateness (arrival - due): p50 %.3f s, p99 %.3f s, max %.3f s, early %d", p50, p99, lateness.last, early)
BenchCommon::Table.row(path: "delay accuracy, #{rate}/s over #{window} s, delays 1-60 s: p50 / p99 late",
                       result: format("%.2f s / %.2f s", p50, p99), target: "p99 <= 2.0 s",
                       pass: p99 <= 2.0 && early.zero?,
                       bound: "whole seconds rounded up (<= 1 s) plus each level's expiry of its head")

# 3. Request/reply vs raw lapin.
rpc_q = queue.call("rpc")
server = IO.popen({ "AMQP_URL" => BenchCommon::URL }, [RPC, "serve", rpc_q])
raise "bench_rpc serve did not start" unless server.gets&.strip == "ready"

raw = lambda do |count, inflight|
  out = IO.popen({ "AMQP_URL" => BenchCommon::URL }, [RPC, "raw_rpc", rpc_q, count.to_s, inflight.to_s], &:read)
  raise "bench_rpc raw_rpc failed: #{out}" unless $?.success?

  JSON.parse(out.lines.last)["rate"]
end
ours = lambda do |count, threads|
  per = count / threads
  BenchCommon.time do
    Array.new(threads) { Thread.new { per.times { mq.request(payload, to: rpc_q) } } }.each(&:join)
  end
end
mq.request(payload, to: rpc_q) # the reply channel opened outside the clock
[[1, BenchCommon.count(2000)], [8, BenchCommon.count(4000)]].each do |k, count|
  samples = { ours: [], raw: [] }
  BenchCommon::RUNS.times do
    samples[:ours] << count / ours.call(count, k)
    samples[:raw] << raw.call(count, k)
  end
  med = samples.transform_values { |xs| BenchCommon.median(xs) }
  rust = BenchCommon.median(Array.new(BenchCommon::RUNS) do
    out = IO.popen({ "AMQP_URL" => BenchCommon::URL }, [RPC, "acemq_rpc", rpc_q, count.to_s, k.to_s], &:read)
    JSON.parse(out.lines.last)["rate"]
  end)
  puts format("  request/reply, %d in flight: acemq Ruby %.0f/s, raw lapin %.0f/s (runs: %s / %s); acemq Rust API %.0f/s",
              k, med[:ours], med[:raw], samples[:ours].map(&:round).join(","), samples[:raw].map(&:round).join(","), rust)
  BenchCommon::Table.ratio(path: "request/reply round trips, #{k} in flight, vs raw lapin", ours: med[:ours],
                           base: med[:raw], target: 0.9, base_name: "raw lapin")
end
Process.kill("TERM", server.pid)
Process.wait(server.pid)
puts "  load average at end: #{File.read('/proc/loadavg').split.first}"
mq.close
bunny = Bunny.new(BenchCommon::URL, logger: Logger.new(nil)).tap(&:start)
# Each queue with its DLQ and the rungs its consumer declared.
BenchCommon.delete_queues(bunny, bunny.create_channel,
                          (names + BenchCommon.queues_named("acemq-bench-delay-").select { |q| q.include?(tag) }).uniq)
bunny.close
