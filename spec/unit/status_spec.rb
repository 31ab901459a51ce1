# frozen_string_literal: true

require "socket"
require "acemq/status"

# The status command's parts without a broker: the Prometheus text it reads,
# the rates it takes from two scrapes, and the table it prints.
RSpec.describe AceMQ::Status do
  describe AceMQ::Status::Prometheus do
    it "reads names, labels (escapes included) and values, skipping comments" do
      samples = described_class.parse(<<~TEXT)
        # HELP messaging_client_consumed_messages_total Deliveries settled.
        # TYPE messaging_client_consumed_messages_total counter
        messaging_client_consumed_messages_total{messaging_destination_name="shop.payments",outcome="accepted"} 12
        messaging_client_consumed_messages_total{messaging_destination_name="shop.payments",outcome="duplicate"} 3 1700000000000
        messaging_client_consumed_messages_total{messaging_destination_name="a\\"b",outcome="accepted"} 1.5e1
        messaging_process_duration_seconds_bucket{le="+Inf"} 4
        up 1
      TEXT
      expect(samples.map(&:name).uniq).to eq(%w[messaging_client_consumed_messages_total
                                                messaging_process_duration_seconds_bucket up])
      expect(described_class.consumed(samples, "shop.payments")).to eq("accepted" => 12.0, "duplicate" => 3.0)
      expect(described_class.consumed(samples, 'a"b')).to eq("accepted" => 15.0)
      expect(samples.find { |s| s.labels["le"] == "+Inf" }.value).to eq(4.0)
      expect(described_class.consumed(samples.reject { |s| s.name.start_with?("messaging_client") }, "x")).to be_nil
    end
  end

  # A /metrics endpoint whose counters move by `step` between scrapes.
  def metrics_server(queue, step:)
    server = TCPServer.new("127.0.0.1", 0)
    scrapes = 0
    thread = Thread.new do
      loop do
        client = server.accept
        client.gets("\r\n\r\n")
        scrapes += 1
        body = "messaging_client_consumed_messages_total{messaging_destination_name=\"#{queue}\",outcome=\"accepted\"} " \
               "#{100 + (scrapes * step)}\n" \
               "messaging_client_consumed_messages_total{messaging_destination_name=\"#{queue}\",outcome=\"duplicate\"} " \
               "#{scrapes * step / 4}\n"
        client.write("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: #{body.bytesize}\r\n" \
                     "Connection: close\r\n\r\n#{body}")
        client.close
      end
    rescue IOError
      nil
    end
    [server, thread]
  end

  let(:url) { memory_url }
  let(:mq) { AceMQ::AMQP::Connection.open(url) }
  let(:queue) { "shop.payments" }

  before do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    2.times { |i| mq.publish({ "i" => i }, to: queue) }
  end

  after { mq.close }

  it "takes the rate and the duplicates from two scrapes of the runner's counter" do
    server, thread = metrics_server(queue, step: 8)
    status = described_class.new(connection: mq, targets: [described_class.target(queue, name: "PaymentsConsumer")],
                                 broker: "memory://", metrics_url: "http://127.0.0.1:#{server.addr[1]}/metrics",
                                 interval: 0.2)
    snapshot = status.collect
    q = snapshot[:consumers].first[:queue]
    expect(q).to include(name: queue, exists: true, ready: 2, unacked: nil, consumers: 0, ready_change_per_s: 0.0)
    # 10 more settled between the scrapes, 2 of them duplicates, in about 0.2 s.
    expect(q[:done_per_s]).to be_within(15).of(10 / 0.2)
    expect(q[:duplicate_ratio]).to eq(0.2)
    expect(snapshot[:metrics_error]).to be_nil

    text = described_class.render(snapshot)
    expect(text).to include("runner metrics: http://127.0.0.1:", "duplicates ", "(20.0% of done)",
                            "outbox: none configured")
    expect(text.lines.map { |l| l.chomp.size }.max).to be <= 80
  ensure
    server&.close
    thread&.join(1)
  end

  def declines(_message) = raise(ArgumentError, "card declined") # STATUS RAISES

  it "gives each newest dead letter's backtrace in the snapshot (--json), and keeps it out of the text" do
    sub = mq.consume(queue, retries: { max_attempts: 1 }) { |m| declines(m) }
    eventually { mq.queue_depth("#{queue}.dlq")&.fetch(:ready) == 2 }
    sub.close
    snapshot = described_class.new(connection: mq, targets: [described_class.target(queue)], broker: "memory://",
                                   interval: 0).collect
    line = File.readlines(__FILE__).index { |l| l.include?("# STATUS" + " RAISES") } + 1
    newest = snapshot[:consumers].first[:dlq][:newest]
    expect(newest.size).to eq(2)
    newest.each { |d| expect(d[:backtrace].lines.first).to match(frame("#{__FILE__}:#{line}", "declines")) }
    expect(described_class.render(snapshot)).not_to include(__FILE__)
  end

  it "says there are no runner metrics when nothing answers, and shows the DLQ's newest reasons" do
    sub = mq.consume(queue, retries: { max_attempts: 1 }) { |_m| AceMQ::AMQP::Ack.reject("bad card") }
    eventually { mq.queue_depth("#{queue}.dlq")&.fetch(:ready) == 2 }
    sub.close

    closed = TCPServer.new("127.0.0.1", 0).tap { |s| @port = s.addr[1] }
    closed.close
    snapshot = described_class.new(connection: mq, targets: [described_class.target(queue)], broker: "memory://",
                                   metrics_url: "http://127.0.0.1:#{@port}/metrics", interval: 0).collect
    dlq = snapshot[:consumers].first[:dlq]
    expect(dlq).to include(exists: true, ready: 2)
    expect(dlq[:newest].map { |d| d[:reason] }).to eq(["bad card", "bad card"])
    text = described_class.render(snapshot)
    expect(text).to include("no runner metrics at http://127.0.0.1:#{@port}/metrics (")
    expect(text).to match(/^  shop\.payments\.dlq +2 +— +0$/)
  end

  it "cuts every line to 80 columns with an ellipsis" do
    long = "q" * 100
    snapshot = { at: "2026-12-01T14:00:00Z", broker: "amqp://guest@127.0.0.1:5672", interval: 1.0,
                 metrics_url: nil, metrics_error: "--metrics none", unacked_from: nil, unacked_error: nil,
                 consumers: [{ name: "C" * 90, queue: { name: long, exists: true, ready: 1, unacked: nil, consumers: 0 },
                               rungs: [], dlq: { name: "#{long}.dlq", exists: false, newest: [] } }],
                 outbox: nil }
    lines = described_class.render(snapshot).lines.map(&:chomp)
    expect(lines.map(&:size).max).to be <= 80
    expect(lines).to include(a_string_starting_with("  #{'q' * 33}… "))
    expect(lines).to include("#{'C' * 79}…")
  end
end
