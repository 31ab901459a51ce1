# frozen_string_literal: true

require "json"
require_relative "phase"

module Drill
  # g. `acemq run --processes 2` (issue 34): one child killed with SIGKILL
  # while it charges, then the other. The parent forks each again; what the
  # dead child had taken goes back to the queue and its claims are taken
  # over after CLAIM_TIMEOUT, so nothing is lost and nothing is charged
  # twice; and the parent's /ready answers 503 from the kill until the new
  # child is running, 200 again after.
  class KillSwarmChild < Phase
    TITLE = "kill -9 a child of --processes 2"
    MESSAGES = 1200
    PROCESSES = 2
    KILLS = 2
    # Publishing lasts about 8 s, past both kills and their gaps.
    RATE = 150

    def run
      queue = "drill-#{tag}-swarm"
      charges, keys = db.charge_tables("drill_#{tag}_swarm")
      declare(AceMQ::AMQP::Topology.new.queue(queue))
      swarm = spawn_swarm(runner_env(queue: queue, origin: "drill-#{tag}-swarm", charges: charges, keys: keys))
      Drill.eventually(30, "the parent's /ready to answer 200") { ready(swarm) == 200 }

      all = orders("S", MESSAGES)
      result.messages = all.size
      t0 = Drill.now
      feed = publisher.pace(all, to: queue, rate: RATE, deadline: Drill.now + 60)
      gaps = []
      victims = []
      KILLS.times do |k|
        at(t0, 1.5 + 2.5 * k, feed)
        child = status(swarm).fetch("children").fetch(k % PROCESSES)
        victims << [child["pid"], Time.now.to_f]
        killed = Drill.now
        Process.kill("KILL", child["pid"])
        # The gap as the parent's probe sees it: 503 within a check
        # interval of the kill, then 200 once the new child subscribed.
        Drill.eventually(3, "/ready to answer 503 after kill -9 of child #{k % PROCESSES}", interval: 0.02) { ready(swarm) == 503 }
        Drill.eventually(20, "/ready to answer 200 again after the kill", interval: 0.05) { ready(swarm) == 200 }
        gaps << Drill.now - killed
        again = status(swarm).fetch("children").fetch(k % PROCESSES)
        unless again["restarts"] == 1 && again["pid"] != child["pid"] && again["last_exit"] == "killed by SIGKILL"
          fail!("child #{k % PROCESSES} was not forked again as expected: #{again.inspect}")
        end
      end
      result.faults = victims.size
      publisher.hurry
      join(feed, 60, "publishing")
      await_charged(charges, all, queue)
      settle(queue)
      account(charges, all, queue)

      # Each replacement charged too: the restart put a process back to work.
      by_pid = db.conn.exec("SELECT pid, COUNT(*) FROM #{charges} GROUP BY pid").values.to_h { |p, n| [Integer(p), Integer(n)] }
      now = status(swarm).fetch("children").map { |c| c["pid"] }
      idle = now.reject { |pid| by_pid[pid].to_i.positive? }
      fail!("a forked-again child charged nothing: #{idle.inspect} (charges by pid #{by_pid.inspect})") unless idle.empty?
      result.recovery = "/ready 503 to 200 after a kill: #{seconds(gaps)}"
      result.worst = gaps.max
      result.notes = "#{reruns} re-run after a kill; charges by pid #{by_pid.values.sort.reverse.join('/')}"
      stop_runners
    end

    private

    # drill/support.rb's Runner.spawn, with --processes.
    def spawn_swarm(env)
      dir = Dir.mktmpdir("acemq-drill-swarm")
      output = File.join(dir, "runner.out")
      log = File.join(dir, "handled.log")
      pid = Process.spawn({ "LOG" => log }.merge(env), RbConfig.ruby, "-I", File.join(ROOT, "lib"), RunnerHelpers::EXE,
                          "run", "-r", File.join(__dir__, "charge_app.rb"), "--processes", PROCESSES.to_s,
                          out: output, err: %i[child out])
      Children.add(pid)
      r = Runner.new(RunnerHelpers::RunnerProcess.new(pid: pid, log: log, output: output), dir, env["ORIGIN"])
      @runners << r
      # The parent logs its port before it forks: the first "health on :".
      Drill.eventually(30, "the parent's health port") { r.exited? ? fail!("the parent died:\n#{r.text}") : r.process.health_port }
      r
    end

    def ready(swarm) = Integer(swarm.health("/ready").code)
    def status(swarm) = JSON.parse(swarm.health("/status").body)
  end
end
