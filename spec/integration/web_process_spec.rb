# frozen_string_literal: true

require "bunny"
require "json"
require "net/http"
require "open3"
require "rack"
require "rack/mock"
require "rbconfig"
require "tempfile"
require "acemq/web"
require_relative "../../drill/support"
require_relative "../../drill/node"

# AceMQ::Web against a private RabbitMQ node with the management plugin
# (the shared broker has it off, and this spec stops its broker): counts,
# unacked and rungs from the management API, the DLQ's count while another
# process holds part of it, `acemq web`'s options and TERM, and a page that
# says which part is down when the broker is (issue 48 part 5).
RSpec.describe "AceMQ::Web with the management API, as a process" do
  WEB_PROCESS_ROOT = File.expand_path("../..", __dir__)

  before(:all) do
    @mport = Drill::Node.free_port
    @node = Drill::Node.new(config: ["management.tcp.port = #{@mport}", "management.tcp.ip = 127.0.0.1"])
    File.write(File.join(@node.dir, "enabled_plugins"), "[rabbitmq_management].\n")
    @node.start
    @management = "http://guest:guest@127.0.0.1:#{@mport}/"
    eventually(timeout: 30) do
      Net::HTTP.start("127.0.0.1", @mport) do |h|
        r = Net::HTTP::Get.new("/api/overview")
        r.basic_auth("guest", "guest")
        h.request(r).is_a?(Net::HTTPSuccess)
      end
    rescue SystemCallError, IOError
      false
    end
    @mq = AceMQ::AMQP::Connection.open(@node.url)
  end

  # Bunny and the spec's connection afresh after an example stopped the node.
  before do
    @bunny = Bunny.new(@node.url, logger: Logger.new(nil)).tap(&:start) unless @bunny&.open?
    @mq = AceMQ::AMQP::Connection.open(@node.url) if @mq.closed?
  end

  after(:all) do
    @mq&.close
    @bunny&.close rescue nil # rubocop:disable Style/RescueModifier
    @node&.destroy
  end

  let(:queue) { unique("web-mgmt") }

  # `acemq web ARGS` on a free port: [pid, base URL, its output].
  def acemq_web(*args, env: {})
    out = Tempfile.new("acemq-web")
    pid = Process.spawn({ "RUBYLIB" => File.join(WEB_PROCESS_ROOT, "lib") }.merge(env), RbConfig.ruby, File.join(WEB_PROCESS_ROOT, "exe", "acemq"),
                        "web", "--url", @node.url, "--port", "0", *args, out: out.path, err: out.path)
    base = eventually(timeout: 20) { File.read(out.path)[%r{acemq web: (http://127\.0\.0\.1:\d+)/}, 1] }
    [pid, base, out]
  end

  def json(base, path) = JSON.parse(Net::HTTP.get(URI("#{base}#{path}")))

  def stop(pid)
    Process.kill("TERM", pid)
    Process.wait(pid)
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  end

  it "takes its counts, unacked and rungs from --management, runs --rabbitmqctl, and stops at once on TERM" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(@mq)
    ch = @bunny.create_channel
    %w[5s 30s].each { |d| ch.queue("#{queue}.retry.#{d}", durable: true) }
    3.times { |n| @mq.publish({ "n" => n }, to: queue) }
    held = @bunny.create_channel
    held.prefetch(10)
    got = Queue.new
    held.queue(queue, passive: true).subscribe(manual_ack: true) { |info, _, _| got << info }
    3.times { got.pop }

    pid, base, = acemq_web("--queue", queue, "--management", @management)
    values = eventually(timeout: 10) { json(base, "/overview.json")["values"].then { |v| v["q:#{queue}:unacked"] == "3" && v } }
    expect(values).to include("q:#{queue}:ready" => "0", "q:#{queue}:total" => "3", "q:#{queue}:consumers" => "1")
    ladder = Net::HTTP.get(URI("#{base}/queues/#{queue}"))
    expect(ladder).to include("#{queue}.retry.5s", "#{queue}.retry.30s")
    expect(ladder.index("#{queue}.retry.5s")).to be < ladder.index("#{queue}.retry.30s")
    # A browser's idle keep-alive connection, open when TERM comes.
    idle = Net::HTTP.start(URI(base).host, URI(base).port)
    idle.get("/overview.json")
    Process.kill("TERM", pid)
    exited = eventually(timeout: 10) { Process.wait2(pid, Process::WNOHANG) }
    expect(exited.last).to be_success
    idle.finish rescue nil # rubocop:disable Style/RescueModifier

    # Without the management API: unacked from rabbitmqctl, which was
    # ignored before (issue 48); HOME holds the node's cookie.
    ctl = "#{Drill::Node::BIN}/rabbitmqctl -n #{@node.name}"
    pid, base, = acemq_web("--queue", queue, "--rabbitmqctl", ctl, env: { "HOME" => File.join(@node.dir, "home") })
    # rabbitmqctl boots an Erlang VM for each listing (a second or two
    # here, past 20 s once in a .ci/run with builds beside it).
    values = eventually(timeout: 60) { json(base, "/overview.json")["values"].then { |v| v["q:#{queue}:unacked"] == "3" && v } }
    expect(values["q:#{queue}:total"]).to eq("3")
    # No ladder assumed without --rungs or the management API.
    expect(Net::HTTP.get(URI("#{base}/queues/#{queue}"))).not_to include("#{queue}.retry.")
  ensure
    stop(pid) if pid
    held&.close rescue nil # rubocop:disable Style/RescueModifier
  end

  it "keeps a DLQ's count while another process reads it (ready + unacked)" do
    AceMQ::AMQP::Topology.new.queue(queue, type: :quorum).apply(@mq)
    ch = @bunny.create_channel
    ch.confirm_select
    3_000.times { |i| ch.default_exchange.publish(%({"n":#{i}}), routing_key: "#{queue}.dlq", persistent: true, message_id: "m#{i}") }
    ch.wait_for_confirms
    eventually(timeout: 20) { @mq.queue_counts("#{queue}.dlq")[:ready] == 3_000 }
    app = AceMQ::Web.new(url: @node.url, queues: [queue], runners: [], management_url: @management)
    http = Rack::MockRequest.new(app)
    code = <<~RUBY
      require "acemq"
      mq = AceMQ::AMQP::Connection.open(ENV.fetch("URL"))
      r = mq.browse_dead_letters(ENV.fetch("Q"), reason: "none like this", within: 6)
      puts r[:scanned]
    RUBY
    # The management API's statistics catch up with a new queue within
    # its collection interval (5 s).
    eventually(timeout: 20) { JSON.parse(http.get("/overview.json").body)["values"]["q:#{queue}:dlq"] == "3,000" }
    stdin, stdout, child = Open3.popen2({ "URL" => @node.url, "Q" => queue, "RUBYLIB" => File.join(WEB_PROCESS_ROOT, "lib") }, RbConfig.ruby, "-e", code)
    stdin.close
    eventually(timeout: 10) { @mq.queue_counts("#{queue}.dlq.reader")&.dig(:consumers) == 1 }
    seen = []
    lows = []
    while @mq.queue_counts("#{queue}.dlq.reader")&.dig(:consumers) == 1
      v = JSON.parse(http.get("/overview.json").body)["values"]
      seen << v["q:#{queue}:dlq"]
      lows << @mq.queue_counts("#{queue}.dlq")[:ready]
      sleep 0.2
    end
    expect(child.value).to be_success
    expect(Integer(stdout.read)).to be_positive
    # The reader held some (ready fell), and the dashboard's count did not.
    expect(lows.min).to be < 3_000
    expect(seen.size).to be >= 3
    # Never lower. Higher by one batch at most, for a moment: past its
    # first 1,000 a read moves letters to the tail, each copy confirmed
    # before its original is acknowledged (a combined run here once saw
    # 3,014). After the read, 3,000 exactly.
    counts = seen.map { Integer(_1.delete(",")) }
    expect(counts).to all(be_between(3_000, 3_200))
    eventually(timeout: 20) { JSON.parse(http.get("/overview.json").body)["values"]["q:#{queue}:dlq"] == "3,000" }
  ensure
    app&.close
  end

  it "draws a queue's chart from the broker's own samples after a restart of the dashboard" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(@mq)
    # Ten seconds of a queue filling, which the plugin samples every 5 s.
    10.times do
      5.times { @mq.publish({}, to: queue) }
      sleep 1
    end
    eventually(timeout: 20) do
      Net::HTTP.start("127.0.0.1", @mport) do |h|
        r = Net::HTTP::Get.new("/api/queues/%2F/#{queue}?lengths_age=60&lengths_incr=5")
        r.basic_auth("guest", "guest")
        JSON.parse(h.request(r).body).dig("messages_ready_details", "samples").to_a.count { _1["sample"].positive? } >= 2
      end
    end
    # A dashboard just started: no sample of its own yet.
    app = AceMQ::Web.new(url: @node.url, queues: [queue], runners: [], management_url: @management)
    chart = Rack::MockRequest.new(app).get("/queues/#{queue}?part=chart").body
    expect(chart).not_to include("No samples yet")
    samples = Integer(chart[/(\d+) samples/, 1])
    expect(samples).to be > 100 # ten minutes at 5 s, and its own
    expect(Float(chart[/Depth: .*?top (\d+(?:\.\d+)?)/m, 1])).to be >= 20 # the plugin lags by up to 5 s
    # Without the management API it starts empty, as before.
    plain = AceMQ::Web.new(url: @node.url, queues: [queue], runners: [])
    expect(Rack::MockRequest.new(plain).get("/queues/#{queue}?part=chart").body).to include("No samples yet")
  ensure
    app&.close
    plain&.close
  end

  it "says which part is down when the broker is, and still shows what does not need it" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(@mq)
    outbox = Object.new
    def outbox.backlog = { count: 2, oldest_age: 1.5, stuck: 0 }
    app = AceMQ::Web.new(url: @node.url, queues: [queue], runners: ["http://127.0.0.1:9"], outbox: outbox)
    http = Rack::MockRequest.new(app)
    expect(http.get("/queues/#{queue}/dlq").status).to eq(200)
    @node.stop_app
    begin
      down = eventually(timeout: 15) { http.get("/queues/#{queue}/dlq").then { |r| r.status == 503 && r } }
      url = "amqp://127.0.0.1:#{@node.port}"
      expect(down.body).to include("The broker is unreachable at <code>#{url}</code>", "Database (the outbox)",
                                   "fine</span>, 2 waiting", "Runner <code>http://127.0.0.1:9</code>")
      expect(down.body).not_to include("guest")
      overview = http.get("/")
      expect(overview.status).to eq(200)
      said = overview.body[%r{<p class="warn" id="broker-down".*?</p>}m]
      expect(said).to include("The broker is down", "broker unreachable at #{url}"), said.inspect
      expect(overview.body).to include("2 waiting", "broker down")
    ensure
      @node.start_app
    end
    eventually(timeout: 20) { http.get("/queues/#{queue}/dlq").status == 200 }
  ensure
    app&.close
  end
end
