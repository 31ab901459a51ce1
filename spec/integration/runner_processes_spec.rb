# frozen_string_literal: true

require "json"
require "tmpdir"

# The runner as an operator meets it: a process, signals, a health endpoint,
# the broker misbehaving. Each example starts `acemq run` as a child against
# RabbitMQ and judges it by what it handled, what it left on the queue, and
# how it exited.
RSpec.describe "acemq run (processes)" do
  include RunnerHelpers

  let(:queue) { unique("runner") }
  let(:origin) { unique("runner-app") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("runner-spec")) }
  let(:env) { { "QUEUE" => queue, "ORIGIN" => origin } }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }

  after do
    reap_runners
    close_bunny
    mq.close
  end

  def publish(*payloads)
    payloads.each { |p| mq.publish(p, to: queue) }
  end

  # Issue 49: the boot log said "prefetch default" and /status "prefetch": 0
  # for a class that left prefetch to the engine; both say what it runs with.
  it "reports the prefetch the engine chose, in the boot log and /status" do
    runner = start_runner(env.merge("CONCURRENCY" => "3", "PREFETCH" => "default"))
    status = JSON.parse(runner.health("/status").body)["consumers"].first
    expect(status).to include("concurrency" => 3, "prefetch" => 32)
    expect(runner.text).to include("RunnerSpecConsumer on #{queue} (concurrency 3, prefetch 32)")
  end

  it "on TERM lets a slow handler finish, acknowledges it, and exits 0" do
    runner = start_runner(env.merge("CONCURRENCY" => "1", "PREFETCH" => "1"))
    publish({ "n" => 1, "sleep" => 1.5 })
    eventually { runner.started == [1] }

    runner.signal("TERM")
    expect(runner.wait(10)).to eq(0)
    expect(runner.done).to eq([1])
    expect(ready_count(queue)).to eq(0) # acknowledged, not redelivered
    expect(runner.text).to include("stopping", "acemq: stopped")
  end

  it "gives a handler slower than shutdown_timeout back to the queue, exiting within the timeout" do
    runner = start_runner(env.merge("SHUTDOWN_TIMEOUT" => "1", "CONCURRENCY" => "1", "PREFETCH" => "1"))
    publish({ "n" => 1, "sleep" => 30 }, { "n" => 2 })
    eventually { runner.started == [1] }

    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    runner.signal("TERM")
    status = runner.wait(10)
    elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
    expect(status).to eq(1) # not clean: a handler was abandoned
    expect(elapsed).to be < 1 + 5 # the timeout plus closing the connections
    expect(runner.done).to eq([])
    expect(runner.text).to include("did not finish within shutdown_timeout")
    # Neither the abandoned one nor the one never started was acknowledged.
    expect(eventually { ready_count(queue) == 2 && 2 }).to eq(2)
  end

  it "exits at once on a second TERM" do
    runner = start_runner(env.merge("SHUTDOWN_TIMEOUT" => "20", "CONCURRENCY" => "1"))
    publish({ "n" => 1, "sleep" => 30 })
    eventually { runner.started == [1] }
    runner.signal("TERM")
    eventually { runner.text.include?("stopping") }
    runner.signal("TERM")
    expect(runner.wait(3)).to eq(1)
    expect(eventually { ready_count(queue) == 1 && 1 }).to eq(1)
  end

  it "takes no new deliveries while quiet (TSTP) and still drains on TERM" do
    runner = start_runner(env)
    publish({ "n" => 1 })
    eventually { runner.done == [1] }
    expect(runner.health("/ready").code).to eq("200")

    runner.signal("TSTP")
    eventually { runner.text.include?("quiet") }
    publish({ "n" => 2 }, { "n" => 3 })
    expect(eventually { ready_count(queue) == 2 && 2 }).to eq(2)
    expect(runner.done).to eq([1])
    expect(runner.health("/ready").code).to eq("503") # not ready: taking nothing
    expect(runner.health("/live").code).to eq("200")  # but alive: no restart wanted

    runner.signal("TERM")
    expect(runner.wait(10)).to eq(0)
    expect(ready_count(queue)).to eq(2)
  end

  it "keeps consuming after the broker closes its connections, without a restart" do
    runner = start_runner(env)
    publish({ "n" => 1 })
    eventually { runner.done == [1] }

    expect(broker_closes_connections(origin)).to be >= 1
    publish({ "n" => 2 })
    eventually(timeout: 15) { runner.done.include?(2) }
    expect(runner.text).not_to include("restarting")
    # Not silent: the log says it lost its channel and came back.
    eventually { runner.text.match?(/RunnerSpecConsumer: AceMQ::AMQP::ConnectionClosed: .*lost its channel and subscribed again/) }
    expect(runner.wait(0)).to be_nil
    expect(runner.health("/ready").code).to eq("200")
  end

  # A handler that does not return (here NoMemoryError) ends its thread; the
  # subscription sends its message round the retry ladder, says so, and
  # starts a fresh thread, so the consumer is never a thread short and the
  # runner has nothing to restart (docs/lifecycle.md, "Consumers").
  it "replaces a handler thread that died, and the message is handled from the retry ladder" do
    runner = start_runner(env.merge("CONCURRENCY" => "1"))
    publish({ "n" => 1, "die" => true })
    eventually(timeout: 15) { runner.done == [1] }
    expect(runner.text).to match(/RunnerSpecConsumer: AceMQ::AMQP::HandlerAborted: .*did not return \(NoMemoryError/)
    expect(runner.text).not_to include("restarting")
    expect(runner.wait(0)).to be_nil
  end

  it "gives up and exits non-zero, saying why, when a subscription cannot recover" do
    runner = start_runner(env.merge("RECOVERY_BOUND" => "0.5", "MAX_RESTARTS" => "1"))
    # The queue goes away under it: every subscribe from now on is a 404.
    require "bunny"
    @bunny ||= Bunny.new(AMQP_URL).tap(&:start)
    @bunny.create_channel.queue_delete(queue)
    status = runner.wait(30)
    expect(status).to eq(1)
    expect(runner.text).to match(/could not subscribe for \d+s/)
    expect(runner.text).to include("giving up")
  ensure
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
  end

  it "serves liveness and readiness, and touches the health file while live" do
    file = File.join(Dir.mktmpdir, "live")
    runner = start_runner(env.merge("HEALTH_FILE" => file))
    expect(runner.health("/live").code).to eq("200")
    expect(runner.health("/ready").code).to eq("200")
    status = JSON.parse(runner.health("/status").body)
    expect(status).to include("state" => "running", "ready" => true)
    expect(status["consumers"].first).to include("name" => "RunnerSpecConsumer", "queue" => queue, "up" => true)
    eventually { File.exist?(file) && Time.now - File.mtime(file) < 1 }

    runner.signal("TERM")
    expect(runner.wait(10)).to eq(0)
    expect(File.exist?(file)).to be(false)
  end

  it "serves the metrics on /metrics: what it handled, by outcome, and its state" do
    runner = start_runner(env)
    publish({ "n" => 1 }, { "n" => 2 }, { "n" => 3 })
    eventually { runner.done.size == 3 }

    response = runner.health("/metrics")
    expect(response.code).to eq("200")
    expect(response["Content-Type"]).to start_with("application/openmetrics-text")
    labels = %(messaging_system="rabbitmq",messaging_destination_name="#{queue}",outcome="accepted")
    text = eventually { (t = runner.health("/metrics").body).include?("messaging_client_consumed_messages_total{#{labels}} 3") && t }
    expect(text).to include("messaging_process_duration_seconds_count{#{labels}} 3")
    expect(text).to include(%(acemq_runner_state{state="running"} 1))
    expect(text).to include("acemq_events_dropped_total 0")
    expect(text.rstrip).to end_with("# EOF")
  end

  it "writes every thread's backtrace to the log on TTIN and keeps running" do
    runner = start_runner(env)
    runner.signal("TTIN")
    eventually { runner.text.include?("acemq: thread acemq #{queue} 1") }
    expect(runner.text).to match(/acemq: thread .*\n  .*runner\.rb:\d+/)
    publish({ "n" => 1 })
    eventually { runner.done == [1] }
  end

  it "refuses --only with a name that is not a consumer, naming the ones there are" do
    out = IO.popen({ "AMQP_URL" => AMQP_URL, "QUEUE" => queue, "ORIGIN" => origin, "LOG" => File::NULL },
                   [RbConfig.ruby, "-I", File.join(RunnerHelpers::ROOT, "lib"), RunnerHelpers::EXE, "run", "-r",
                    RunnerHelpers::APP, "--only", "NopeConsumer"], err: %i[child out], &:read)
    expect($?.exitstatus).to eq(64)
    expect(out).to include("no consumer named NopeConsumer", "RunnerSpecConsumer")
  end
end
