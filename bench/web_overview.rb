# frozen_string_literal: true

# Where AceMQ::Web's overview spends its time (issue 48 part 5), with 50
# consumer queues (each with its 4 rung queues and its DLQ: 300 queues) on
# the broker at AMQP_URL (or BENCH_WEB_URL). Prints medians of
# BENCH_RUNS x 10 requests (GET / through Rack::MockRequest) and of each
# part alone, against the baseline of Bunny's 300 passive declares:
#
#   counts      Connection#queue_counts_many of the 300 (what Status#sample asks)
#   delayed     Connection#delayed (the delay cascade's levels)
#   render      the ERB pages with the data already fetched
#   management  one GET /api/queues/{vhost}?columns=... (BENCH_WEB_MANAGEMENT:
#               a management URL, e.g. http://guest:guest@127.0.0.1:15673/;
#               the overview then takes its counts from it)
#
#   ruby -Ilib bench/web_overview.rb
#   BENCH_WEB_URL=amqp://guest:guest@127.0.0.1:5673 \
#     BENCH_WEB_MANAGEMENT=http://guest:guest@127.0.0.1:15673/ ruby -Ilib bench/web_overview.rb

require_relative "common"
require "rack"
require "rack/mock"
require "acemq/web"

module WebOverviewBench
  C = BenchCommon
  URL = ENV.fetch("BENCH_WEB_URL", C::URL)
  MANAGEMENT = ENV.fetch("BENCH_WEB_MANAGEMENT", nil)
  QUEUES = 50
  TAG = SecureRandom.hex(3)
  # The default ladder's rungs, given as `acemq web --rungs` would.
  RUNGS = %w[1s 2s 4s 8s].freeze

  def self.ms(seconds) = format("%.1f ms", seconds * 1000)

  def self.median_of(n)
    times = Array.new(n) do
      t0 = C.now
      yield
      C.now - t0
    end
    C.median(times)
  end

  def self.run
    C.banner("AceMQ::Web overview, #{QUEUES} queues, on #{URL}#{MANAGEMENT ? " with #{MANAGEMENT}" : ''}")
    mq = AceMQ::AMQP::Connection.open(URL)
    bunny = Bunny.new(URL, logger: Logger.new(nil)).tap(&:start)
    ch = bunny.create_channel
    names = Array.new(QUEUES) { |i| "bench-webo-#{TAG}-#{i}" }
    topology = AceMQ::AMQP::Topology.new
    names.each { |n| topology.queue(n, type: :quorum) }
    topology.apply(mq)
    n = C::RUNS * 10
    results = {}
    [nil, MANAGEMENT].uniq.each do |management|
      app = AceMQ::Web.new(connection: mq, queues: names, runners: [], management_url: management, rungs: RUNGS)
      all = app.source.targets.flat_map { |t| [t.queue, *t.rungs, t.dlq] }
      app.source.targets.flat_map(&:rungs).each { |r| ch.queue(r, durable: true) }
      http = Rack::MockRequest.new(app)
      http.get("/")
      label = management ? "management API" : "passive declares"
      results["overview (#{label})"] = median_of(n) { raise "overview failed" unless http.get("/").status == 200 }
      results["overview.json (#{label})"] = median_of(n) { http.get("/overview.json") }
      results["  Source#overview (#{label})"] = median_of(n) { app.source.overview }
      if management
        results["  management GET alone"] = median_of(n) { app.source.management.queues }
      else
        results["  counts: queue_counts_many of #{all.size}"] = median_of(n) { mq.queue_counts_many(all) }
        results["  delayed"] = median_of(n) { mq.delayed }
        results["baseline: Bunny's #{all.size} passive declares"] = median_of(n) { all.each { |q| ch.queue_declare(q, passive: true) } }
      end
      app.close
      @all = all
    end
    base = results.find { |k, _| k.start_with?("baseline") }&.last
    results.each do |k, v|
      puts format("%-48s %10s%s", k, ms(v), base ? format("  %.2fx baseline", v / base) : "")
    end
  ensure
    # After both sides: the second measures the same 300 queues.
    @all&.each { |q| ch.queue_delete(q) rescue nil } # rubocop:disable Style/RescueModifier
    ch&.close
    bunny&.close
    mq&.close
  end
end

WebOverviewBench.run if $PROGRAM_NAME == __FILE__
