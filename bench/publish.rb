# frozen_string_literal: true

# Issue 12: Ruby publish batch, confirms together, against raw lapin from
# Rust (the most any client gets from this broker here), with Bunny 2.19
# printed beside it. Each side publishes the same N 1 KiB JSON messages,
# persistent, to the same durable queue (purged before every timed run) and
# waits for every confirm together: acemq with `mq.batch { … }`, lapin with
# `bench raw publish_batch` (core/examples/bench.rs), Bunny with publish then
# wait_for_confirms. The sides are alternated run by run; medians.
#
#   rake bench                 # builds the release extension, runs every bench
#   ruby bench/publish.rb      # this file alone (the extension and
#                              # target/release/examples/bench must be built)
#
# AMQP_URL, BENCH_RUNS (default 3), BENCH_SCALE (default 1.0).

require_relative "common"

module PublishBench
  C = BenchCommon
  N = C.count(10_000)
  PATH = "Ruby publish batch, confirms together, vs raw lapin"
  TARGET = 0.95

  class Runner
    include C::Cleanup

    def initialize = setup_resources("publish")

    def queue(name)
      q = "#{@prefix}-#{name}"
      AceMQ::AMQP::Topology.new.queue(q).apply(@mq)
      @queues << q << "#{q}.dlq"
      q
    end

    def timed(q, &block)
      @admin.queue_purge(q)
      seconds = C.time(&block)
      got = @admin.queue_declare(q, passive: true).message_count
      raise "#{q} holds #{got} messages after a run of #{N}" unless got == N

      seconds
    end

    # The wire message acemq sends (its properties and x-acemq-* headers),
    # as bench/run.rb's Bunny side sends it.
    def bunny_publish(x, q, i)
      id = SecureRandom.uuid
      x.publish(JSON.generate(C::PAYLOADS[i % 64]), routing_key: q, persistent: true, content_type: "application/json",
                                                    message_id: id, timestamp: Time.now.to_i, app_id: "bench@host",
                                                    headers: { "x-acemq-id" => id, "x-acemq-attempt" => 1,
                                                               "x-acemq-origin" => "bench@host" })
    end

    def run
      q = queue("batch")
      ch = @bunny.create_channel
      ch.confirm_select
      x = ch.default_exchange
      built = [] # the held batch's share of its time spent in the block, before anything is sent
      rates = C.alternate(N, {
                            acemq: lambda do
                              block = nil
                              seconds = timed(q) do
                                @mq.batch do |b|
                                  t = C.now
                                  N.times { |i| b.publish(C::PAYLOADS[i % 64], to: q) }
                                  block = C.now - t
                                end
                              end
                              built << block / seconds
                              seconds
                            end,
                            stream: lambda do
                              timed(q) { @mq.batch(stream: true) { |b| N.times { |i| b.publish(C::PAYLOADS[i % 64], to: q) } } }
                            end,
                            lapin: lambda do
                              @admin.queue_purge(q)
                              rate = C.lapin(:publish_batch, q, N)
                              N / rate
                            end,
                            bunny: lambda do
                              timed(q) do
                                N.times { |i| bunny_publish(x, q, i) }
                                ch.wait_for_confirms
                              end
                            end
                          })
      ch.close
      puts format("  %-44s acemq %8.0f/s  lapin %8.0f/s  Bunny %8.0f/s  %5.2fx (Bunny %.2fx)",
                  "publish batch of #{N}, confirms together", rates[:acemq], rates[:lapin], rates[:bunny],
                  rates[:acemq] / rates[:lapin], rates[:bunny] / rates[:lapin])
      puts format("  %-44s acemq %8.0f/s  lapin %8.0f/s  %5.2fx", "the same, batch(stream: true)", rates[:stream],
                  rates[:lapin], rates[:stream] / rates[:lapin])
      held = C.median(built)
      puts format("  %-44s %.1f%% of the held batch's time is its block, when nothing is sent; " \
                  "the rest ran at %.2fx of lapin", "", held * 100, rates[:acemq] / (1 - held) / rates[:lapin])
      # Held (the default: a block that raises sends nothing, so the broker
      # waits while the block builds) and streamed (sent while it builds,
      # as raw lapin and Bunny send): both rows, as the table prints both.
      C::Table.ratio(path: PATH, ours: rates[:acemq], base: rates[:lapin], target: TARGET, base_name: "lapin",
                     bound: "see bench/README.md, publish")
      C::Table.ratio(path: "#{PATH}, batch(stream: true)", ours: rates[:stream], base: rates[:lapin], target: TARGET,
                     base_name: "lapin", bound: "see bench/README.md, publish")
    ensure
      cleanup
    end
  end
end

C = BenchCommon
C.banner("bench/publish.rb")
PublishBench::Runner.new.run
