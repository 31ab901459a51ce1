# frozen_string_literal: true

require "net/http"
require "rbconfig"

# Runner processes for the specs: `acemq run` started as a child with its
# output in a file, waited for by what it logs, signalled and reaped by pid.
module RunnerHelpers
  ROOT = File.expand_path("../..", __dir__)
  EXE = File.join(ROOT, "exe", "acemq")
  APP = File.join(ROOT, "spec", "fixtures", "runner_app.rb")

  RunnerProcess = Struct.new(:pid, :log, :output, keyword_init: true) do
    def text = File.exist?(output) ? File.read(output) : ""
    def handled = File.exist?(log) ? File.readlines(log, chomp: true) : []
    def done = handled.grep(/\Adone /).map { |l| Integer(l.split.last) }
    def started = handled.grep(/\Astart /).map { |l| Integer(l.split.last) }
    def health_port = text[/health on :(\d+)/, 1]&.to_i
    def signal(sig) = Process.kill(sig, pid)

    def health(path)
      Net::HTTP.start("127.0.0.1", health_port, open_timeout: 1, read_timeout: 2) { |h| h.get(path) }
    end

    # The exit status, or nil if it has not exited within timeout.
    def wait(timeout)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      loop do
        _, status = Process.waitpid2(pid, Process::WNOHANG)
        return status.exitstatus || (128 + status.termsig.to_i) if status
        return nil if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

        sleep 0.05
      end
    end
  end

  def start_runner(env = {}, app: APP, args: [])
    dir = Dir.mktmpdir("acemq-runner")
    output = File.join(dir, "runner.out")
    log = File.join(dir, "handled.log")
    pid = spawn({ "AMQP_URL" => AMQP_URL, "LOG" => log }.merge(env),
                RbConfig.ruby, "-I", File.join(ROOT, "lib"), EXE, "run", "-r", app, *args,
                out: output, err: %i[child out], pgroup: true)
    runner = RunnerProcess.new(pid: pid, log: log, output: output)
    (@runners ||= []) << runner
    eventually(timeout: 20) { runner.text.include?("acemq: running") || (runner.wait(0) && raise("runner died:\n#{runner.text}")) }
    runner
  end

  # Kill what the example started and did not reap, by pid.
  def reap_runners
    (@runners || []).each do |r|
      Process.kill("KILL", r.pid)
      Process.wait(r.pid)
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    end
  end

  # reap_runners for runners with children (`--processes`): each runner
  # and its children are one process group of the spec's own (pgroup: true).
  def reap_runner_groups
    (@runners || []).each do |r|
      Process.kill("KILL", -r.pid)
    rescue Errno::ESRCH
      nil
    end
    reap_runners
  end

  # Ready messages on a RabbitMQ queue, through a Bunny session of the spec's own.
  def ready_count(queue)
    require "bunny"
    @bunny ||= Bunny.new(AMQP_URL).tap(&:start)
    ch = @bunny.create_channel
    ch.queue(queue, passive: true).message_count
  ensure
    ch&.close
  end

  def close_bunny
    @bunny&.close
    @bunny = nil
  end
end
