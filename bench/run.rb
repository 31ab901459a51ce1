# frozen_string_literal: true

# AceMQ against Bunny 2.19 on the same broker, in the same run.
#
#   rake bench                      # builds the release extension, runs the Rust bench, then this
#   ruby bench/run.rb               # this file alone (the extension must be built)
#
# AMQP_URL overrides the broker (default amqp://guest:guest@127.0.0.1:5672).
# BENCH_RUNS (default 5) runs per side and case; the median is reported.
# BENCH_SCALE (default 1.0) multiplies every message count.
#
# Every case sends the same 1 KiB JSON object, persistent. Queues are named
# per run, purged before every timed run and deleted at the end.

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
# `rake bench` points this at a private copy of the extension it just built.
$LOAD_PATH.unshift(File.expand_path(ENV["ACEMQ_BENCH_EXT"])) if ENV["ACEMQ_BENCH_EXT"]
require "acemq"
require "bunny"
require "json"
require "logger"
require "securerandom"
require_relative "common"

module Bench
  URL = ENV.fetch("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
  RUNS = Integer(ENV.fetch("BENCH_RUNS", "5"))
  SCALE = Float(ENV.fetch("BENCH_SCALE", "1"))
  PREFETCH = 100
  # A run that has not finished by then is a hang, not a slow result.
  RUN_LIMIT = 60

  # The payload, the clock, the median and the latch are the other
  # benchmarks' too (bench/common.rb): the same 1 KiB order everywhere.
  def self.count(n) = BenchCommon.count(n)
  def self.now = BenchCommon.now
  def self.median(xs) = BenchCommon.median(xs)
  PAYLOADS = BenchCommon::PAYLOADS
  Latch = BenchCommon::Latch

  N_EACH = count(2_000)
  N_THREADS = count(4_000)
  N_BATCH = count(10_000)
  N_CONSUME = count(10_000)
  N_RETRY = count(3_000)
  THREADS = 8
  Ack = AceMQ::AMQP::Ack

  class Runner
    # cleanup: its queues and both connections (bench/common.rb).
    include BenchCommon::Cleanup

    def initialize
      @mq = AceMQ::AMQP::Connection.open(URL, origin: "acemq-bench")
      @bunny = Bunny.new(URL, logger: Logger.new(nil))
      @bunny.start
      @admin = @bunny.create_channel
      @prefix = "acemq-bench-#{Process.pid}-#{SecureRandom.hex(3)}"
      @queues = []
      @rows = []
    end

    def queue(name)
      q = "#{@prefix}-#{name}"
      AceMQ::AMQP::Topology.new.queue(q).apply(@mq)
      @queues << q << "#{q}.dlq"
      q
    end

    def purge(q) = @admin.queue_purge(q)

    # Seconds for one run of the block, the queue purged first.
    def timed(q)
      purge(q)
      GC.start
      t = Bench.now
      yield
      Bench.now - t
    end

    # Medians of msg/s for two sides, their runs alternated so that whatever
    # else the machine is doing falls on both.
    def pair(n, ours, base)
      runs = Array.new(RUNS) { [n / ours.call, n / base.call] }
      [Bench.median(runs.map(&:first)), Bench.median(runs.map(&:last))]
    end

    def row(name, ours, base, baseline_name, target)
      ratio = ours / base
      @rows << [name, ours, base, baseline_name, ratio, target, ratio >= target ? "pass" : "MISS"]
      $stdout.puts format("  %-44s acemq %8.0f/s  %-16s %8.0f/s  %5.2fx", name, ours, baseline_name, base, ratio)
    end

    def info_row(name, ours, base, baseline_name)
      @rows << [name, ours, base, baseline_name, ours / base, nil, "(info)"]
      $stdout.puts format("  %-44s acemq %8.0f/s  %-16s %8.0f/s  %5.2fx", name, ours, baseline_name, base, ours / base)
    end

    def bunny_publisher(q)
      ch = @bunny.create_channel
      ch.confirm_select
      [ch, ch.default_exchange]
    end

    # The same wire message acemq sends: its properties and its three
    # x-acemq-* headers. The broker does the same work for both sides, so
    # the ratio measures the clients.
    def bunny_publish(x, q, i)
      id = SecureRandom.uuid
      x.publish(JSON.generate(PAYLOADS[i % 64]), routing_key: q, persistent: true, content_type: "application/json",
                                                 message_id: id, timestamp: Time.now.to_i, app_id: "bench@host",
                                                 headers: { "x-acemq-id" => id, "x-acemq-attempt" => 1,
                                                            "x-acemq-origin" => "bench@host" })
    end

    # 1. One publish, one confirm, N times.
    def publish_each
      q = queue("each")
      n = N_EACH
      ch, x = bunny_publisher(q)
      ours, base = pair(n,
                        -> { timed(q) { n.times { |i| @mq.publish(PAYLOADS[i % 64], to: q) } } },
                        lambda do
                          timed(q) do
                            n.times do |i|
                              bunny_publish(x, q, i)
                              ch.wait_for_confirms
                            end
                          end
                        end)
      ch.close
      @bunny_each = base
      row("1 publish, each confirm awaited", ours, base, "Bunny", 1.2)
    end

    # 2. Eight Ruby threads on one connection, each waiting for its own
    # confirm, against Bunny on one thread (case 1's figure).
    def publish_threads
      q = queue("threads")
      per = N_THREADS / THREADS
      n = per * THREADS
      ours = Bench.median(Array.new(RUNS) do
        n / timed(q) do
          Array.new(THREADS) { |t| Thread.new { per.times { |i| @mq.publish(PAYLOADS[(t + i) % 64], to: q) } } }.each(&:join)
        end
      end)
      row("2 publish, #{THREADS} threads, each confirm", ours, @bunny_each, "Bunny 1 thread", 3.0)
    end

    # 3. N publishes, their confirms awaited together.
    def publish_batch
      q = queue("batch")
      n = N_BATCH
      ch, x = bunny_publisher(q)
      ours, base = pair(n,
                        -> { timed(q) { @mq.batch { |b| n.times { |i| b.publish(PAYLOADS[i % 64], to: q) } } } },
                        lambda do
                          timed(q) do
                            n.times { |i| bunny_publish(x, q, i) }
                            ch.wait_for_confirms
                          end
                        end)
      ch.close
      row("3 publish batch, confirms together", ours, base, "Bunny", 2.0)
    end

    def preload(q, n)
      purge(q)
      (0...n).each_slice(2_000) { |slice| @mq.batch { |b| slice.each { |i| b.publish(PAYLOADS[i % 64], to: q) } } }
    end

    # Seconds until n preloaded messages have been handled and the
    # subscription cancelled (which sends the last acks).
    def acemq_consume(q, n, retries: nil, &verdict)
      preload(q, n)
      GC.start
      latch = Latch.new(n)
      t = Bench.now
      sub = @mq.consume(q, prefetch: PREFETCH, retries: retries) do |m|
        ack = verdict.call(m)
        latch.hit if ack.accept?
        ack
      end
      latch.wait(RUN_LIMIT)
      sub.cancel
      Bench.now - t
    end

    def bunny_consume(q, n)
      preload(q, n)
      GC.start
      latch = Latch.new(n)
      t = Bench.now
      ch = @bunny.create_channel
      ch.prefetch(PREFETCH)
      consumer = ch.queue(q, passive: true).subscribe(manual_ack: true) do |di, _props, body|
        JSON.parse(body)["order_id"]
        ch.ack(di.delivery_tag)
        latch.hit
      end
      latch.wait(RUN_LIMIT)
      consumer.cancel
      ch.close
      Bench.now - t
    end

    # Seconds for raw lapin (core/examples/bench.rs, `bench raw consume`)
    # to consume n preloaded messages, parse each and ack every 50.
    def lapin_consume(q, n)
      preload(q, n)
      n / BenchCommon.lapin(:consume, q, n)
    end

    # 4. Consume, parse, accept: against raw lapin (the issue-12 row) and
    # Bunny, the three alternated run by run.
    def consume
      q = queue("consume")
      n = N_CONSUME
      accept = lambda do |m|
        m.payload["order_id"]
        Ack.accept
      end
      rates = BenchCommon.alternate(n, { acemq: -> { acemq_consume(q, n, &accept) },
                                         lapin: -> { lapin_consume(q, n) },
                                         bunny: -> { bunny_consume(q, n) } })
      row("4 consume + parse + ack (prefetch #{PREFETCH})", rates[:acemq], rates[:bunny], "Bunny", 3.0)
      info_row("4 consume + parse + ack, vs raw lapin", rates[:acemq], rates[:lapin], "raw lapin")
      # 0.95x: issue 31's target (issue 12's was 0.90x).
      BenchCommon::Table.ratio(path: "Ruby consume + parse + accept, vs raw lapin", ours: rates[:acemq],
                               base: rates[:lapin], target: 0.95, base_name: "lapin",
                               bound: "see bench/README.md, Ruby consume")
    end

    # 5. Retry every message once through the ladder (a 50 ms first rung),
    # then accept it; against accepting at once. N messages are loaded first
    # and the clock stops when all N are accepted, so the figure is the
    # settle path's throughput, not the rung's TTL.
    def retry_once
      q = queue("retry")
      retries = { max_attempts: 5, initial_delay: 0.05, max_delay: 1 }
      @queues.concat(rungs(q, AceMQ::AMQP::RetryPolicy.from(retries)))
      n = N_RETRY
      accept = lambda do |m|
        m.payload["order_id"]
        Ack.accept
      end
      # Raw lapin does the same broker work (the copy to the same rung,
      # confirmed, then the ack; the TTL brings it back): its retry against
      # its own accept is what the broker allows any client.
      rates = BenchCommon.alternate(n, {
                                      retry: lambda do
                                        acemq_consume(q, n, retries: retries) do |m|
                                          m.attempt == 1 ? Ack.retry("once") : accept.call(m)
                                        end
                                      end,
                                      accept: -> { acemq_consume(q, n, retries: retries, &accept) },
                                      lapin_retry: lambda do
                                        preload(q, n)
                                        n / BenchCommon.lapin(:retry_once, q, n)
                                      end,
                                      lapin_accept: -> { lapin_consume(q, n) }
                                    })
      info_row("5 retry once then accept (ladder 50 ms)", rates[:retry], rates[:accept], "acemq accept")
      info_row("5 raw lapin: retry once, vs its accept", rates[:lapin_retry], rates[:lapin_accept], "lapin accept")
      info_row("5 retry once: acemq vs raw lapin", rates[:retry], rates[:lapin_retry], "lapin retry")
      broker = rates[:lapin_retry] / rates[:lapin_accept]
      # Issue 31: the client's own share, against raw lapin doing the same
      # (`bench raw retry_once`, core/examples/bench.rs).
      BenchCommon::Table.ratio(path: "Ruby retry once then accept, vs raw lapin's retry", ours: rates[:retry],
                               base: rates[:lapin_retry], target: 0.95, base_name: "lapin retry",
                               bound: "see bench/README.md, retry")
      BenchCommon::Table.ratio(path: "retry once then accept, vs accept", ours: rates[:retry], base: rates[:accept],
                               target: 0.30, base_name: "accept",
                               bound: format("raw lapin doing the same broker work gets %.2fx of its own accept, " \
                                             "and acemq's retry runs at %.2fx of raw lapin's retry (same run)",
                                             broker, rates[:retry] / rates[:lapin_retry]))
    end

    # 7. A delivery that is not JSON, dead-lettered by the engine before any
    # handler sees it, against a handler rejecting a JSON one: the clock
    # stops when the DLQ holds all n, the same end for both.
    def undecodable
      q = queue("undecodable")
      dlq = "#{q}.dlq"
      n = N_RETRY
      ch = @bunny.create_channel
      ch.confirm_select
      x = ch.default_exchange
      load = lambda do |json|
        purge(q)
        purge(dlq)
        body = json ? JSON.generate(PAYLOADS[0]) : "not json #{'x' * 1015}"
        n.times do |i|
          x.publish(body, routing_key: q, persistent: true, content_type: "application/json", message_id: "m-#{i}")
        end
        ch.wait_for_confirms
      end
      until_dead_lettered = lambda do |handler|
        GC.start
        t = Bench.now
        sub = @mq.consume(q, prefetch: PREFETCH, &handler)
        deadline = t + RUN_LIMIT
        sleep 0.005 until @admin.queue_declare(dlq, passive: true).message_count >= n || Bench.now > deadline
        took = Bench.now - t
        sub.cancel
        took
      end
      rates = BenchCommon.alternate(n, {
                                      engine: lambda do
                                        load.call(false)
                                        until_dead_lettered.call(->(_m) { raise "a handler ran for an undecodable delivery" })
                                      end,
                                      handler: lambda do
                                        load.call(true)
                                        until_dead_lettered.call(->(_m) { Ack.reject("no") })
                                      end
                                    })
      ch.close
      info_row("7 undecodable dead-lettered, vs handler reject", rates[:engine], rates[:handler], "handler reject")
      BenchCommon::Table.ratio(path: "undecodable delivery dead-lettered, vs a handler's reject", ours: rates[:engine],
                               base: rates[:handler], target: 0.8, base_name: "reject")
    end

    # 6. Case 4 with one subscriber to process.acemq (the engine builds an
    # event per message and the Ruby dispatcher thread delivers it), against
    # case 4 with nobody subscribed, alternated in the same run.
    def consume_subscribed
      q = queue("events")
      n = N_CONSUME
      accept = lambda do |m|
        m.payload["order_id"]
        Ack.accept
      end
      heard = 0
      ours, base = pair(n,
                        lambda do
                          subscriber = AceMQ.subscribe("process.acemq") { heard += 1 }
                          begin
                            acemq_consume(q, n, &accept)
                          ensure
                            AceMQ.unsubscribe(subscriber)
                          end
                        end,
                        -> { acemq_consume(q, n, &accept) })
      info_row("6 consume, one process.acemq subscriber", ours, base, "no subscriber")
      puts format("    (%d events heard, %d dropped)", heard, AceMQ::Events.dropped)
    end

    # The rung queues the engine declares for this policy (names as in core/src/retry.rs).
    def rungs(q, policy)
      (1...policy.max_attempts).map do |attempt|
        ms = [(policy.initial_delay * 1000 * (2**(attempt - 1))).round, (policy.max_delay * 1000).round].min
        ms % 1000 == 0 ? "#{q}.retry.#{ms / 1000}s" : "#{q}.retry.#{ms}ms"
      end.uniq
    end

    def run
      started = Bench.now
      puts "AceMQ Ruby bench: #{URL.sub(%r{//[^@]*@}, '//')}, 1 KiB JSON, persistent, median of #{RUNS} runs, " \
           "Ruby #{RUBY_VERSION}, Bunny #{Bunny::VERSION}"
      so = $LOADED_FEATURES.find { |f| f.end_with?("/acemq.so") && f.include?("acemq/") }
      puts format("extension: %s (%.1f MB%s)", so, File.size(so) / 1e6,
                  File.size(so) > 20e6 ? ", looks like a debug build: figures will be low" : "")
      # BENCH_CASES=consume,retry_once runs only those.
      cases = ENV.fetch("BENCH_CASES", "publish_each,publish_threads,publish_batch,consume,retry_once,undecodable," \
                                       "consume_subscribed").split(",")
      cases.each { |c| public_send(c.strip) }
      table
      puts format("(%.0f s)", Bench.now - started)
    ensure
      cleanup
    end

    def table
      puts
      puts "| case | acemq msg/s | baseline | baseline msg/s | ratio | target | result |"
      puts "|---|---:|---|---:|---:|---:|---|"
      @rows.each do |name, ours, base, bname, ratio, target, result|
        puts format("| %s | %.0f | %s | %.0f | %.2fx | %s | %s |", name, ours, bname, base, ratio,
                    target ? format(">= %.1fx", target) : "-", result)
      end
    end

  end
end

Bench::Runner.new.run
