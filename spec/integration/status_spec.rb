# frozen_string_literal: true

require "json"
require "open3"
require "shellwords"
require "tmpdir"
require "acemq/amqp/patterns"
require "sqlite3"

# `acemq status` as an operator runs it: a runner consuming on the shared
# RabbitMQ, messages ready, one held (unacked), one waiting in a rung, one
# dead-lettered, rows in an outbox nobody relays; then `exe/acemq status` as
# a subprocess, its output read as text (and as an 80-column tmux pane when
# tmux is installed) and as --json.
RSpec.describe "acemq status (processes)" do
  include RunnerHelpers

  STATUS_APP = File.join(RunnerHelpers::ROOT, "spec", "fixtures", "status_app.rb")

  let(:queue) { unique("status") }
  let(:origin) { unique("status-app") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("status-spec")) }
  let(:dir) { Dir.mktmpdir("acemq-status") }
  let(:outbox_path) { File.join(dir, "outbox.db") }
  let(:env) { { "QUEUE" => queue, "ORIGIN" => origin, "AMQP_URL" => AMQP_URL } }

  after do
    reap_runners
    delete_queues(queue, "#{queue}.retry.60s", "#{queue}.dlq", *@extra_queues)
    close_bunny
    mq.close
  end

  def delete_queues(*names)
    require "bunny"
    @bunny ||= Bunny.new(AMQP_URL).tap(&:start)
    names.compact.each do |n|
      ch = @bunny.create_channel
      ch.queue_delete(n)
    rescue Bunny::Exception
      nil
    ensure
      ch&.close if ch&.open?
    end
  end

  def status(*args, env: {})
    out, err, st = Open3.capture3({ "AMQP_URL" => AMQP_URL, "COLUMNS" => "80" }.merge(env),
                                  RbConfig.ruby, "-I", File.join(RunnerHelpers::ROOT, "lib"), RunnerHelpers::EXE, "status", *args)
    expect(st.exitstatus).to eq(0), "acemq status failed:\n#{out}\n#{err}"
    out
  end

  # The same command in an 80x24 tmux pane: what a terminal shows, lines
  # wider than the pane wrapped, as a person would see them.
  def in_tmux(args, env)
    socket = unique("acemq-status-spec")
    command = [*env.map { |k, v| "#{k}=#{v}" }, RbConfig.ruby, "-I", File.join(RunnerHelpers::ROOT, "lib"), RunnerHelpers::EXE, "status", *args]
    shell = "env #{command.map { |a| Shellwords.escape(a) }.join(' ')}; echo __end__; sleep 60"
    system("tmux", "-L", socket, "new-session", "-d", "-x", "80", "-y", "24", shell, exception: true)
    pane = eventually(timeout: 20, interval: 0.2) do
      text = IO.popen(["tmux", "-L", socket, "capture-pane", "-p"], &:read)
      text.include?("__end__") && text
    end
    pane.lines.map(&:rstrip).take_while { |l| l != "__end__" }
  ensure
    system("tmux", "-L", socket, "kill-server", out: File::NULL, err: File::NULL) if socket
  end

  it "shows ready, unacked, consumers, the rung, the DLQ's newest reason and the outbox backlog" do
    runner = start_runner(env, app: STATUS_APP)
    mq.publish({ "do" => "reject", "n" => 1 }, to: queue)
    mq.publish({ "do" => "retry" }, to: queue)
    mq.publish({ "do" => "hold", "for" => 30 }, to: queue)
    3.times { mq.publish({ "do" => "accept" }, to: queue) }
    eventually(timeout: 10) do
      ready_count("#{queue}.dlq") == 1 && ready_count("#{queue}.retry.60s") == 1 && ready_count(queue) == 3
    end

    store = AceMQ::AMQP::Patterns::SQLOutboxStore.new(path: outbox_path)
    store.create_schema
    db = SQLite3::Database.new(outbox_path)
    2.times { |i| store.add(AceMQ::AMQP::Patterns.record(mq, { "i" => i }, to: "nowhere"), connection: db) }
    db.close

    metrics = "http://127.0.0.1:#{runner.health_port}/metrics"
    status_env = env.merge("OUTBOX_PATH" => outbox_path)
    args = ["-r", STATUS_APP, "--metrics", metrics, "--interval", "0.5"]
    text = status(*args, env: status_env)
    lines = text.lines.map(&:chomp)

    expect(lines.map(&:size).max).to be <= 80
    expect(lines).to include(a_string_matching(/\A  #{Regexp.escape(queue)} +3 +1 +1 +[+-]\d+\.\d\b/))
    expect(lines).to include(a_string_matching(/\A  #{Regexp.escape(queue)}\.retry\.60s +1 +0 +0\z/))
    expect(lines).to include(a_string_matching(/\A  #{Regexp.escape(queue)}\.dlq +1 +0 +0\z/))
    expect(text).to include("StatusSpecConsumer (#{queue})", "attempt 1: card declined: 1",
                            "outbox acemq_outbox: 2 waiting, oldest ", "unacked: from ")
    # The runner's health port answers; whether it serves /metrics yet is
    # the metrics work's: either way the status says which.
    expect(text).to match(/no runner metrics at #{Regexp.escape(metrics)} \(|duplicates \d+\.\d\/s/)

    json = JSON.parse(status(*args, "--json", env: status_env))
    c = json.fetch("consumers").fetch(0)
    expect(c["name"]).to eq("StatusSpecConsumer")
    expect(c["queue"]).to include("name" => queue, "ready" => 3, "unacked" => 1, "consumers" => 1)
    expect(c["rungs"]).to eq([{ "name" => "#{queue}.retry.60s", "exists" => true, "ready" => 1, "unacked" => 0,
                                "consumers" => 0 }])
    expect(c["dlq"]).to include("name" => "#{queue}.dlq", "ready" => 1, "unacked" => 0)
    expect(c["dlq"]["newest"].first).to include("attempt" => 1, "reason" => "card declined: 1")
    expect(json["outbox"]).to include("table" => "acemq_outbox", "waiting" => 2, "failing" => 0)
    expect(json["metrics_url"]).to eq(metrics)

    skip "tmux is not installed: the captured run above is the 80-column check" unless system("which tmux > /dev/null")

    pane = in_tmux(args, status_env)
    # Nothing wrapped: the pane shows the lines the captured run printed.
    expect(pane.reject(&:empty?).size).to eq(lines.reject(&:empty?).size), "pane:\n#{pane.join("\n")}\n\nstdout:\n#{text}"
    expect(pane).to include(a_string_matching(/\A  #{Regexp.escape(queue)}\.dlq +1 +0 +0\z/))
  end

  it "looks at a queue by name without an app, cutting a long name to fit" do
    long = "#{unique('status')}.#{'payments-and-refunds-' * 3}in"
    @extra_queues = [long, "#{long}.dlq"]
    AceMQ::AMQP::Topology.new.queue(long).apply(mq)
    2.times { |i| mq.publish({ "i" => i }, to: long) }

    text = status("--queue", long, "--metrics", "none", "--rabbitmqctl", "none", "--interval", "0")
    lines = text.lines.map(&:chomp)
    expect(lines.map(&:size).max).to be <= 80
    row = lines.find { |l| l.start_with?("  #{long[0, 20]}") && !l.include?(".dlq") && l.include?(" 2 ") }
    expect(row).to match(/\A  #{Regexp.escape(long[0, 33])}… +2 +— +0\b/)
    expect(text).to include("unacked: — (", "no runner metrics: --metrics none")

    json = JSON.parse(status("--queue", long, "--metrics", "none", "--rabbitmqctl", "none", "--interval", "0", "--json"))
    q = json["consumers"].first
    expect(q["name"]).to be_nil
    expect(q["queue"]).to include("name" => long, "ready" => 2, "unacked" => nil, "consumers" => 0)
    expect(q["rungs"]).to all(include("exists" => false)) # the default ladder's, never declared here
    expect(q["dlq"]).to include("exists" => true, "ready" => 0)
  end

  it "is the rake task acemq:status too, the app loaded by :environment" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    mq.publish({ "do" => "accept" }, to: queue)
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "Rakefile"), <<~RUBY)
        task(:environment) { require #{STATUS_APP.inspect} }
        load #{File.join(RunnerHelpers::ROOT, 'lib', 'acemq', 'tasks', 'rails.rake').inspect}
      RUBY
      out, st = Open3.capture2e(env.merge("JSON" => "1", "METRICS" => "none", "INTERVAL" => "0"), RbConfig.ruby, "-I",
                                File.join(RunnerHelpers::ROOT, "lib"), "-S", "rake", "-f", File.join(dir, "Rakefile"),
                                "acemq:status", chdir: dir)
      expect(st).to be_success, out
      json = JSON.parse(out)
      expect(json["consumers"].first["queue"]).to include("name" => queue, "ready" => 1, "consumers" => 0)
      expect(json["metrics_error"]).to eq("--metrics none")
    end
  end

  it "says where to run it from, outside an app and without --queue" do
    Dir.mktmpdir do |dir|
      out, st = Open3.capture2e({ "AMQP_URL" => AMQP_URL }, RbConfig.ruby, "-I", File.join(RunnerHelpers::ROOT, "lib"),
                                RunnerHelpers::EXE, "status", chdir: dir)
      expect(st.exitstatus).to eq(64)
      expect(out).to include("no config/environment.rb in", "give -r FILE")
    end
  end
end
