# frozen_string_literal: true

require "json"
require "socket"
require "tmpdir"

# `acemq run --processes 2` as an operator meets it: a parent and its forked
# children against RabbitMQ (and PostgreSQL for what the parent holds),
# judged by which process handled what, what the parent's one health
# endpoint says, and how the parent exits.
RSpec.describe "acemq run --processes (a supervisor of forked runners)" do
  include RunnerHelpers
  include ActiveRecordSpecHelpers

  SWARM_APP = File.join(RunnerHelpers::ROOT, "spec", "fixtures", "swarm_app.rb")
  let(:queue) { unique("swarm") }
  let(:beats) { unique("swarm-beat") }
  let(:origin) { unique("swarm-app") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("swarm-spec")) }
  let(:env) { { "QUEUE" => queue, "ORIGIN" => origin, "BEAT_QUEUE" => beats } }

  before { AceMQ::AMQP::Topology.new.queue(queue).queue(beats).apply(mq) }

  after do
    reap_runner_groups
    close_bunny
    mq.close
  end

  def start_swarm(extra = {})
    runner = start_runner(env.merge(extra), app: SWARM_APP, args: %w[--processes 2])
    eventually(timeout: 20) { runner.health("/ready").code == "200" }
    runner
  end

  def publish(*payloads) = payloads.each { |p| mq.publish(p, to: queue) }
  def lines(runner, word) = runner.handled.grep(/\A#{word} /)
  def pid_of(line) = Integer(line[/pid=(\d+)/, 1])
  def status_of(runner) = JSON.parse(runner.health("/status").body)
  def child_pids(runner) = status_of(runner)["children"].map { |c| c["pid"] }

  it "runs the consumers in two forked processes, each after on_worker_boot, and lists them on /status and /metrics" do
    runner = start_swarm
    publish(*(1..20).map { |n| { "n" => n, "sleep" => 0.05 } })
    eventually(timeout: 10) { lines(runner, "done").size == 20 }

    children = child_pids(runner)
    expect(children.compact.size).to eq(2)
    expect(children).not_to include(runner.pid)
    expect(lines(runner, "done").map { |l| pid_of(l) }.uniq).to match_array(children) # both took work
    boots = lines(runner, "worker_boot")
    expect(boots.map { |l| l.split[1] }).to match_array(%w[0 1])
    expect(boots.map { |l| Integer(l[/parent=(\d+)/, 1]) }.uniq).to eq([runner.pid])

    status = status_of(runner)
    expect(status["state"]).to eq("running")
    expect(status["children"].map { |c| [c["index"], c["state"], c["runner"]["ready"]] })
      .to eq([[0, "running", true], [1, "running", true]])
    metrics = runner.health("/metrics").body
    expect(metrics).to include('acemq_runner_state{process="0",state="running"} 1',
                               'acemq_runner_state{process="1",state="running"} 1',
                               'acemq_processes{state="running"} 2')
    expect(metrics.scan(/^# TYPE acemq_runner_state /).size).to eq(1) # one family, both children's samples
  end

  it "forks a child killed with KILL again: /ready is 503 for the gap, and nothing is lost" do
    runner = start_swarm("CONCURRENCY" => "1", "PREFETCH" => "1")
    publish(*(1..30).map { |n| { "n" => n, "sleep" => 0.1 } })
    eventually { lines(runner, "done").size >= 4 }
    victim = child_pids(runner).first

    Process.kill("KILL", victim)
    eventually(timeout: 3) { runner.health("/ready").code == "503" }
    eventually(timeout: 10) { runner.health("/ready").code == "200" }
    status = status_of(runner)
    expect(status["children"][0]).to include("restarts" => 1, "state" => "running", "last_exit" => "killed by SIGKILL")
    expect(status["children"][0]["pid"]).not_to eq(victim)
    expect(runner.text).to include("acemq: process 0 killed by SIGKILL; forking it again")

    eventually(timeout: 15) { lines(runner, "done").map { |l| Integer(l.split[1]) }.uniq.size == 30 }
    expect(eventually { ready_count(queue).zero? }).to be(true)
    runner.signal("TERM")
    expect(runner.wait(15)).to eq(0)
  end

  it "on TERM drains every child's running handler and exits 0" do
    runner = start_swarm("CONCURRENCY" => "1", "PREFETCH" => "1")
    publish({ "n" => 1, "sleep" => 1.5 }, { "n" => 2, "sleep" => 1.5 })
    eventually { lines(runner, "start").map { |l| pid_of(l) }.uniq.size == 2 }

    runner.signal("TERM")
    expect(runner.wait(15)).to eq(0)
    expect(lines(runner, "done").map { |l| l.split[1] }).to match_array(%w[1 2])
    expect(ready_count(queue)).to eq(0)
    expect(runner.text).to include("acemq: stopped (exit 0)")
  end

  it "exits 1 when a child had to give a handler back at shutdown_timeout" do
    runner = start_swarm("SHUTDOWN_TIMEOUT" => "1", "CONCURRENCY" => "1", "PREFETCH" => "1")
    publish({ "n" => 1, "sleep" => 30 })
    eventually { lines(runner, "start").size == 1 }

    runner.signal("TERM")
    expect(runner.wait(10)).to eq(1)
    expect(eventually { ready_count(queue) == 1 }).to be(true) # back on the queue, not acknowledged
  end

  it "kills a child that ignores TERM at shutdown_timeout + 3 s and exits 3" do
    runner = start_swarm("SHUTDOWN_TIMEOUT" => "1", "CONCURRENCY" => "1", "PREFETCH" => "1")
    publish({ "n" => 1, "ignore_term" => true, "sleep" => 30 })
    eventually { lines(runner, "start").size == 1 }
    stuck = pid_of(lines(runner, "start").first)

    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    runner.signal("TERM")
    expect(runner.wait(15)).to eq(3)
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0).to be_between(1 + 3 - 0.5, 1 + 3 + 3)
    expect(runner.text).to include("(pid #{stuck}) did not stop within shutdown_timeout; killing it")
    expect(eventually { ready_count(queue) == 1 }).to be(true)
  end

  it "stops its children when the parent itself is killed with KILL" do
    runner = start_swarm
    children = child_pids(runner)
    Process.kill("KILL", runner.pid)
    expect(runner.wait(5)).to eq(128 + 9)
    gone = lambda do |pid|
      Process.kill(0, pid)
      File.read("/proc/#{pid}/stat").split[2] == "Z"
    rescue Errno::ESRCH, Errno::ENOENT
      true
    end
    expect(eventually(timeout: 10) { children.all?(&gone) }).to be(true)
    expect(runner.text.scan(/the parent \(pid #{runner.pid}\) is gone; stopping/).size).to eq(2)
  end

  it "refuses a pool smaller than one process's threads in the parent, before forking (exit 64)",
     if: ActiveRecordSpecHelpers.postgres? do
    out = File.join(Dir.mktmpdir("acemq-swarm"), "out")
    pid = spawn({ "AMQP_URL" => AMQP_URL, "LOG" => File.join(File.dirname(out), "log"), "PARENT_HOLDS" => "1",
                  "CONCURRENCY" => "10" }.merge(env), # ActiveRecord's default pool is 5
                RbConfig.ruby, "-I", File.join(RunnerHelpers::ROOT, "lib"), RunnerHelpers::EXE, "run", "-r", SWARM_APP,
                "--processes", "2", out: out, err: %i[child out])
    _, status = Process.wait2(pid)
    expect(status.exitstatus).to eq(64)
    expect(File.read(out)).to include("the ActiveRecord pool has 5 connections and the consumers run 10 threads")
    expect(File.read(out)).not_to include("forked")
  end

  it "exits 2 once a child has died more often than max_restarts allows" do
    runner = start_swarm("MAX_RESTARTS" => "1")
    first = child_pids(runner).first
    Process.kill("KILL", first)
    eventually(timeout: 10) { (pid = child_pids(runner).first) && pid != first && runner.health("/ready").code == "200" }

    Process.kill("KILL", child_pids(runner).first)
    expect(runner.wait(15)).to eq(2)
    expect(runner.text).to include("restarted 1 times within 300s, giving up")
    # The last line says the status it exits with (break-it: "exit 0"), and
    # counts the one process left to stop.
    expect(runner.text).to include("acemq: stopped (exit 2)", "stopping 1 process:")
    expect(runner.text).not_to include("stopped (exit 0)")
  end

  it "refuses max_restarts it cannot keep before forking (exit 64), naming it" do
    ["-1", "4294967296"].each do |bad|
      out = File.join(Dir.mktmpdir("acemq-swarm"), "out")
      pid = spawn({ "AMQP_URL" => AMQP_URL, "LOG" => File.join(File.dirname(out), "log"), "MAX_RESTARTS" => bad }.merge(env),
                  RbConfig.ruby, "-I", File.join(RunnerHelpers::ROOT, "lib"), RunnerHelpers::EXE, "run", "-r", SWARM_APP,
                  "--processes", "2", out: out, err: %i[child out])
      _, status = Process.wait2(pid)
      expect(status.exitstatus).to eq(64), File.read(out)
      expect(File.read(out)).to include("max_restarts must be a whole number from 0 to 4294967295 (got #{bad})")
      expect(File.read(out)).not_to include("forked", "RangeError")
    end
  end

  # Break-it: the parent answered one connection at a time, so ten idle
  # connections held /live for 19.6 s, and a pause waiting on a stopped
  # worker held every probe behind it.
  it "answers probes at once beside idle connections and a pause waiting on a stopped worker" do
    runner = start_swarm
    port = runner.health_port
    idle = Array.new(10) { TCPSocket.new("127.0.0.1", port) }
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    expect(runner.health("/live").code).to eq("200")
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0).to be < 3
    stopped = child_pids(runner).last
    Process.kill("STOP", stopped)
    pausing = Thread.new do
      Net::HTTP.start("127.0.0.1", port, read_timeout: 30) { |h| h.request(Net::HTTP::Post.new("/consumers/SwarmSpecConsumer/pause")) }
    end
    sleep 0.5
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    expect(runner.health("/live").code).to eq("503") # a worker that does not answer is not live
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0).to be < 5
    res = pausing.value
    expect(res.code).to eq("503")
    expect(res.body).to include("1 of 2 did not answer 200", "(pid #{stopped}): no answer")
  ensure
    idle&.each(&:close)
    Process.kill("CONT", stopped) if stopped
  end

  it "sends TSTP on: no child takes a new delivery, /ready is 503, and TERM still stops them" do
    runner = start_swarm
    runner.signal("TSTP")
    eventually { runner.text.scan("quiet: taking no new deliveries").size == 2 }
    expect(runner.health("/ready").code).to eq("503")
    expect(runner.health("/live").code).to eq("200")
    publish({ "n" => 1 }, { "n" => 2 })
    expect(eventually { ready_count(queue) == 2 }).to be(true)
    expect(lines(runner, "start")).to eq([])
    runner.signal("TTIN")
    eventually { runner.text.scan(/acemq: thread .* run/).size >= 2 } # both children's main threads

    runner.signal("TERM")
    expect(runner.wait(15)).to eq(0)
  end

  # Part 2 of issue 34: what the parent opened while booting is never used
  # by a child, and a child's use, exit or death never touches it.
  it "keeps the parent's AMQP and PostgreSQL connections its own through a child's use, clean exit and KILL",
     if: ActiveRecordSpecHelpers.postgres? do
    runner = start_swarm("PARENT_HOLDS" => "1", "CONCURRENCY" => "1", "PREFETCH" => "1")
    parent_backend = Integer(lines(runner, "parent_backend").first.split[1])
    publish(*(1..6).map { |n| { "n" => n, "use_parent" => true, "sleep" => 0.05 } })
    eventually(timeout: 10) { lines(runner, "done").size == 6 }

    # Each child used a PostgreSQL session of its own, and was refused the
    # parent's AMQP connection rather than writing on its socket.
    backends = lines(runner, "backend").map { |l| [pid_of(l), Integer(l.split[2])] }.uniq
    expect(backends.map(&:first).uniq.size).to eq(2)
    expect(backends.map(&:last).uniq.size).to eq(2)
    expect(backends.map(&:last)).not_to include(parent_backend)
    expect(lines(runner, "parent_connection_used")).to eq([])
    expect(lines(runner, "parent_connection_refused").size).to eq(6)

    # One child exits cleanly (TERM to it alone: the parent forks it again),
    # the other is killed.
    first, second = child_pids(runner)
    Process.kill("TERM", first)
    eventually(timeout: 10) { status_of(runner)["children"][0]["restarts"] == 1 && runner.health("/ready").code == "200" }
    Process.kill("KILL", second)
    eventually(timeout: 10) { status_of(runner)["children"][1]["restarts"] == 1 && runner.health("/ready").code == "200" }
    seen = lines(runner, "beat").size
    eventually(timeout: 5) { lines(runner, "beat").size >= seen + 10 }

    # The parent went on publishing and querying on what it opened, on the
    # same PostgreSQL session, without one error.
    expect(lines(runner, "beat_error")).to eq([])
    # (The beat thread's session is its own ActiveRecord connection, not the
    # main thread's.)
    beat_backends = lines(runner, "beat").map { |l| Integer(l[/backend=(\d+)/, 1]) }.uniq
    expect(beat_backends.size).to eq(1)
    expect(lines(runner, "beat").map { |l| pid_of(l) }.uniq).to eq([runner.pid])
    expect(lines(runner, "backend").map { |l| Integer(l.split[2]) }).not_to include(*beat_backends)
    sessions = [parent_backend, *beat_backends]
    live = pg_admin { |c| c.exec_params("SELECT count(*) FROM pg_stat_activity WHERE pid IN ($1, $2)", sessions).getvalue(0, 0) }
    expect(Integer(live)).to eq(2)
    runner.signal("TERM")
    expect(runner.wait(15)).to eq(0)
  end
end
