# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"

# Pausing one consumer class at run time (issue 36 part 2), as an operator
# does it: `acemq ctl pause NAME` or POST /consumers/NAME/pause against a
# running `acemq run` (and its --processes parent), judged by what the
# broker holds, what the runner handled, and what /ready, /status and
# `acemq status` say.
RSpec.describe "pausing a consumer at run time (processes)" do
  include RunnerHelpers

  SWARM_FIXTURE = File.join(RunnerHelpers::ROOT, "spec", "fixtures", "swarm_app.rb")
  let(:queue) { unique("pause") }
  let(:origin) { unique("pause-app") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("pause-spec")) }
  let(:env) { { "QUEUE" => queue, "ORIGIN" => origin, "CONCURRENCY" => "1", "PREFETCH" => "4" } }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }

  after do
    reap_runner_groups
    close_bunny
    mq.close
  end

  def publish(*payloads) = payloads.each { |p| mq.publish(p, to: queue) }

  def ctl(*args, token: nil)
    env = token ? { "ACEMQ_CONTROL_TOKEN" => token } : {}
    Open3.capture3(env, RbConfig.ruby, "-I", File.join(RunnerHelpers::ROOT, "lib"), RunnerHelpers::EXE, "ctl", *args)
  end

  def post(runner, path, token: nil)
    Net::HTTP.start("127.0.0.1", runner.health_port, open_timeout: 1, read_timeout: 10) do |h|
      req = Net::HTTP::Post.new(path)
      req["Authorization"] = "Bearer #{token}" if token
      h.request(req)
    end
  end

  def consumer_status(runner) = JSON.parse(runner.health("/status").body)["consumers"].first

  it "holds nothing while paused, gives back what it had buffered unspent, stays ready, and resumes" do
    runner = start_runner(env)
    publish(*(1..12).map { |n| { "n" => n, "sleep" => 0.3 } })
    eventually { runner.started.include?(1) }

    out, err, status = ctl("pause", "RunnerSpecConsumer", "--runner", "http://127.0.0.1:#{runner.health_port}")
    expect(status.exitstatus).to eq(0), err
    expect(out).to include("paused RunnerSpecConsumer")
    # What the handler held finishes; everything else is back on the queue:
    # nothing unacknowledged is left with the paused consumer.
    eventually(timeout: 10) { ready_count(queue) + runner.done.size == 12 && runner.done.size == runner.started.size }
    held = runner.started.size
    sleep 1 # a paused consumer that still took deliveries would start one here
    expect(runner.started.size).to eq(held)
    expect(ready_count(queue)).to eq(12 - held)

    expect(runner.health("/ready").code).to eq("200") # paused, not dead
    expect(consumer_status(runner)).to include("paused" => true, "up" => true)
    metrics = runner.health("/metrics").body
    expect(metrics).to match(/acemq_consumer_paused\{messaging_destination_name="#{queue}"\} 1/)

    # acemq status says so beside a queue with no broker consumer.
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(RunnerHelpers::ROOT, "lib"), RunnerHelpers::EXE, "status",
                                      "--queue", queue, "--url", AMQP_URL, "--metrics",
                                      "http://127.0.0.1:#{runner.health_port}/metrics", "--rabbitmqctl", "none",
                                      "--interval", "0.2")
    expect(status.exitstatus).to eq(0), err
    expect(out).to include("#{queue}: paused")

    # A name the runner does not run: 404 naming the ones it does, and the
    # runner goes on.
    bad = post(runner, "/consumers/NoSuchConsumer/pause")
    expect(bad.code).to eq("404")
    expect(bad.body).to include("RunnerSpecConsumer")
    expect(post(runner, "/consumers/RunnerSpecConsumer/resume").code).to eq("200")
    eventually(timeout: 15) { runner.done.size == 12 }
    # Every message ran once: the ones given back were not started before
    # the pause and were not spent by it.
    expect(runner.started.tally.values.uniq).to eq([1])
    expect(runner.started.sort).to eq((1..12).to_a)
    expect(consumer_status(runner)).to include("paused" => false)
  end

  it "takes control requests with the control token when one is set, and refuses them without it" do
    runner = start_runner(env.merge("ACEMQ_CONTROL_TOKEN" => "s3cret"))
    refused = post(runner, "/consumers/RunnerSpecConsumer/pause")
    expect(refused.code).to eq("403")
    expect(refused.body).to include("control token")
    expect(post(runner, "/consumers/RunnerSpecConsumer/pause", token: "wrong").code).to eq("403")
    expect(consumer_status(runner)["paused"]).to be(false)

    _, err, status = ctl("pause", "RunnerSpecConsumer", "--runner", "http://127.0.0.1:#{runner.health_port}", token: "s3cret")
    expect(status.exitstatus).to eq(0), err
    expect(consumer_status(runner)["paused"]).to be(true)
    publish({ "n" => 1 })
    sleep 0.5
    expect(runner.started).to eq([])
    _, err, status = ctl("resume", "NoSuchConsumer", "--runner", "http://127.0.0.1:#{runner.health_port}", token: "s3cret")
    expect(status.exitstatus).to eq(65)
    expect(err).to include("RunnerSpecConsumer")
    expect(post(runner, "/consumers/RunnerSpecConsumer/resume", token: "s3cret").code).to eq("200")
    eventually { runner.done == [1] }
  end

  # The break-it run of issue 50: with a control token the workers asked for
  # it from the parent too, and the parent sent none (503: "2 of 2 processes
  # did not answer 200"); one client now carries it for every caller.
  it "passes a control request with the control token on to every worker of --processes, and refuses one without it" do
    runner = start_runner(env.merge("ACEMQ_CONTROL_TOKEN" => "s3cret"), app: SWARM_FIXTURE, args: %w[--processes 2])
    eventually(timeout: 20) { runner.health("/ready").code == "200" }
    expect(post(runner, "/consumers/SwarmSpecConsumer/pause").code).to eq("403")
    expect(post(runner, "/consumers/SwarmSpecConsumer/pause", token: "wrong").code).to eq("403")
    _, err, status = ctl("pause", "SwarmSpecConsumer", "--runner", "http://127.0.0.1:#{runner.health_port}", token: "s3cret")
    expect(status.exitstatus).to eq(0), err
    children = JSON.parse(runner.health("/status").body)["children"]
    expect(children.map { |c| c.dig("runner", "consumers", 0, "paused") }).to eq([true, true])
    publish({ "n" => 1 })
    sleep 0.5
    expect(runner.handled.grep(/\Astart /)).to eq([])
    res = post(runner, "/consumers/SwarmSpecConsumer/resume", token: "s3cret")
    expect(res.code).to eq("200"), res.body
    expect(res.body).to include("in 2 processes")
    eventually(timeout: 10) { runner.handled.grep(/\Adone /).size == 1 }
  end

  it "pauses every worker of --processes through the parent, and a worker forked again after kill -9 boots paused" do
    runner = start_runner(env.merge("CONCURRENCY" => "2"), app: SWARM_FIXTURE, args: %w[--processes 2])
    eventually(timeout: 20) { runner.health("/ready").code == "200" }
    res = post(runner, "/consumers/SwarmSpecConsumer/pause")
    expect(res.code).to eq("200"), res.body
    expect(res.body).to include("in 2 processes")
    children = JSON.parse(runner.health("/status").body)["children"]
    expect(children.map { |c| c.dig("runner", "consumers", 0, "paused") }).to eq([true, true])

    victim = children.first["pid"]
    Process.kill("KILL", victim)
    eventually(timeout: 20) do
      now = JSON.parse(runner.health("/status").body)["children"]
      now.first["pid"] != victim && now.first["state"] == "running" && now.first.dig("runner", "consumers", 0, "paused")
    end
    publish(*(1..4).map { |n| { "n" => n } })
    sleep 1
    expect(runner.handled.grep(/\Astart /)).to eq([])
    expect(ready_count(queue)).to eq(4)
    expect(post(runner, "/consumers/SwarmSpecConsumer/resume").code).to eq("200")
    eventually(timeout: 10) { runner.handled.grep(/\Adone /).size == 4 }
  end
end
