# frozen_string_literal: true

# AceMQ::Web's server time (issue 33), on the broker at AMQP_URL (or
# BENCH_WEB_URL), each against a baseline measured in the same run:
#
#   overview  GET / with 50 consumer queues (each with its 4 rung queues and
#             its DLQ: 300 queues), through Rack::MockRequest, against the
#             same 300 passive declares made by Bunny (the broker alone).
#             Target: under 100 ms.
#   dlq       a quorum DLQ of BENCH_WEB_DLQ (100,000) dead letters: the
#             first page, page 40 and page 400 (25 a page), against Bunny
#             reading the same number of messages with basic.get and giving
#             them back (basic.nack multiple, requeue); then filters that
#             match near the head and 10,000 deep (each read
#             once: a filter reads up to its match).
#
# Medians of BENCH_RUNS (default 3; the overview 10x as many) alternated
# runs.
#
#   ruby -Ilib bench/web.rb                # the extension must be built
#   BENCH_WEB_URL=amqp://guest:guest@127.0.0.1:5693 ruby -Ilib bench/web.rb

require_relative "common"
require "rack"
require "rack/mock"
require "acemq/web"

module WebBench
  C = BenchCommon
  URL = ENV.fetch("BENCH_WEB_URL", C::URL)
  QUEUES = 50
  DLQ = Integer(ENV.fetch("BENCH_WEB_DLQ", "100000"))
  TAG = SecureRandom.hex(3)

  def self.ms(seconds) = format("%.1f ms", seconds * 1000)

  def self.timed
    t0 = C.now
    yield
    C.now - t0
  end

  def self.run
    C.banner("AceMQ::Web server time on #{URL}")
    mq = AceMQ::AMQP::Connection.open(URL)
    bunny = Bunny.new(URL, logger: Logger.new(nil)).tap(&:start)
    ch = bunny.create_channel
    puts "broker: RabbitMQ #{mq.server_version}"
    overview(mq, ch) unless ENV["BENCH_WEB_PAGES"] == "1"
    dlq(mq, ch)
  ensure
    ch&.close
    bunny&.close
    mq&.close
  end

  def self.overview(mq, ch)
    names = Array.new(QUEUES) { |i| "bench-web-#{TAG}-#{i}" }
    topology = AceMQ::AMQP::Topology.new
    names.each { |n| topology.queue(n, type: :quorum) }
    topology.apply(mq)
    app = AceMQ::Web.new(connection: mq, queues: names, runners: [])
    http = Rack::MockRequest.new(app)
    all = app.source.targets.flat_map { |t| [t.queue, *t.rungs, t.dlq] }
    raise "expected 300 queues, got #{all.size}" unless all.size == QUEUES * 6

    # The rung queues a consumer declares when it starts (none runs here).
    app.source.targets.flat_map(&:rungs).each { |r| ch.queue(r, durable: true) }

    http.get("/") # warm: the targets and the connection
    web = []
    base = []
    (C::RUNS * 10).times do
      web << timed { raise "overview failed" unless http.get("/").status == 200 }
      base << timed { all.each { |n| ch.queue_declare(n, passive: true) } }
    end
    w = C.median(web)
    b = C.median(base)
    puts "overview, #{QUEUES} queues (#{all.size} passive declares): #{ms(w)} median of #{web.size} " \
         "(Bunny's passive declares alone #{ms(b)}, #{format('%.2fx', w / b)} of them)"
  ensure
    all&.each { |n| ch.queue_delete(n) rescue nil } # rubocop:disable Style/RescueModifier
  end

  def self.dlq(mq, ch)
    queue = "bench-web-dlq-#{TAG}"
    AceMQ::AMQP::Topology.new.queue(queue, type: :quorum).apply(mq)
    dlq = "#{queue}.dlq"
    ids = []
    t = timed do
      (0...DLQ).each_slice(1000) do |slice|
        mq.batch do |b|
          slice.each do |n|
            headers = { "x-acemq-reason" => "card declined for order #{n}", "x-acemq-failed-at" => Time.now.to_i,
                        "x-acemq-error-class" => n % 10 == 7 ? "Payments::Timeout" : "Payments::Declined" }
            ids << b.publish({ "order" => n, "amount_cents" => 1000 + n }, to: dlq, type: "order.placed.v1",
                                                                         headers: headers).id
          end
        end
      end
    end
    sleep 0.1 until mq.queue_counts(dlq)[:ready] == DLQ
    puts "filled #{dlq} with #{DLQ} dead letters in #{format('%.1f', t)} s"
    app = AceMQ::Web.new(connection: mq, queues: [queue], runners: [], page_size: 25)
    http = Rack::MockRequest.new(app)
    # BENCH_WEB_PAGES=1: the first page and the filters only (page 400 of
    # 100,000 takes Bunny and AceMQ about 25 s each a run).
    pages = ENV["BENCH_WEB_PAGES"] == "1" ? [1] : [1, 40, 400]
    pages.each do |page|
      read = page * 25 + 1
      web = []
      base = []
      C::RUNS.times do
        web << timed { raise "page failed" unless http.get("/queues/#{queue}/dlq?page=#{page}").body.include?("Page #{page}:") }
        base << timed do
          last = nil
          read.times { last = ch.basic_get(dlq, manual_ack: true).first }
          ch.nack(last.delivery_tag, true, true)
        end
      end
      w = C.median(web)
      b = C.median(base)
      puts "page #{page} (reads #{read}): #{ms(w)} (Bunny basic.get x #{read} and a nack #{ms(b)}, #{format('%.2fx', w / b)})"
    end
    # A filter reads up to its match (an id filter stops once it has found
    # every id): one near the head, one 10,000 deep. One that matches
    # nothing reads the whole DLQ: 10x the second.
    [["id of the 10th", ids[9]], ["id of the 10,000th", ids[9_999]]].each do |what, id|
      body = nil
      w = timed { body = http.get("/queues/#{queue}/dlq?id=#{id}").body }
      scanned = body[/Read ([\d,]+) messages/, 1]
      found = body.include?(%(id="dl-#{id}"))
      puts "filter by #{what}: #{ms(w)}, read #{scanned}, found=#{found}"
    end
    w = timed { http.get("/queues/#{queue}/dlq?error_class=Payments::Timeout") }
    puts "filter by error class (1 in 10 match; stops after the page's 25 and one more): #{ms(w)}"
  ensure
    ch.queue_delete(queue) rescue nil # rubocop:disable Style/RescueModifier
    ch.queue_delete(dlq) rescue nil # rubocop:disable Style/RescueModifier
    AceMQ::Status.target(queue).rungs.each { |r| ch.queue_delete(r) rescue nil } # rubocop:disable Style/RescueModifier
  end
end

if $PROGRAM_NAME == __FILE__
  $stdout.sync = true
  WebBench.run
end
