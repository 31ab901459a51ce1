# frozen_string_literal: true

require "fileutils"
require "time"
require "acemq/swarm/health"

module AceMQ
  # `acemq run --processes N` (or config.processes = N): a parent that boots
  # the application once, then forks N children that each run every consumer
  # as one Runner does. One Ruby process runs Ruby on one core at a time; N
  # processes run handlers on N cores.
  #
  # The parent opens nothing of its own (no connection, no engine runtime):
  # it forks, watches, restarts and answers the health endpoint. A child
  # opens its own connections after the fork and runs config.on_worker_boot
  # first, for what the application holds (see docs/lifecycle.md).
  #
  # Restarts: a child that dies while the parent is not stopping is forked
  # again after a pause doubling from 1 s to 30 s, at most max_restarts
  # within restart_window per child: core's restart rule, the one the
  # runner keeps for each consumer (AMQP::RestartBudget, one per child).
  # Past that the parent stops every child and exits 2.
  #
  # Signals: TERM or INT is sent to every child, which drains within
  # shutdown_timeout; a child still there KILL_GRACE seconds after that is
  # killed. A second TERM or INT is sent on too (children exit at once).
  # TSTP and TTIN are sent on. Exit statuses are the constants below.
  class Swarm
    # Every child drained and exited 0.
    EXIT_CLEAN = 0
    # A child had to abandon handlers (their messages went back to the
    # queue) or exited non-zero while stopping: what a Runner exits 1 for.
    EXIT_UNFINISHED = 1
    # The restart budget was spent: children kept dying.
    EXIT_GAVE_UP = 2
    # A child did not exit within shutdown_timeout + KILL_GRACE and was
    # killed (KILL): its deliveries go back to the queue unacknowledged.
    EXIT_KILLED = 3

    # Past shutdown_timeout a child still closes its connections (a round
    # trip each); under the 5 s most platforms leave between the default
    # shutdown_timeout (core's RunnerOptions, 25 s) and their KILL (30 s).
    KILL_GRACE = 3
    SIGNALS = %w[TERM INT TSTP TTIN CHLD].freeze

    # One child process: its index (0...N) is kept across restarts.
    Child = Struct.new(:index, :pid, :state, :report, :health_port, :budget, :restart_at,
                       :last_exit, :started_at, keyword_init: true) do
      def total_restarts = budget.total
    end

    attr_reader :processes, :children, :health_port

    def initialize(processes:, consumers:, config: AceMQ::Rails.config, executor: nil)
      @processes = Integer(processes)
      raise AMQP::ConfigurationError, "processes must be at least 1 (got #{processes})" if @processes < 1

      @consumers = consumers
      @config = config
      @executor = executor
      @logger = config.logger
      # Core's restart rule, one budget a child (the extension starts no
      # runtime by being loaded or by these); refused here, before any fork.
      rule = Runner.restart_rule(config)
      @check = Float(config.check_interval || AMQP::NativeSupervisor::RUNNER_DEFAULTS.fetch(:heartbeat))
      @children = Array.new(@processes) do |i|
        Child.new(index: i, state: :new, budget: AMQP::RestartBudget.new(**rule))
      end
      @signal_in, @signal_out = IO.pipe
      @lock = Mutex.new
      @stopping = false
      @quiet = false
      @state = :booting
      # Consumer classes paused through the parent's endpoint: every worker
      # was told, and a worker forked later is paused as it boots (it
      # inherits this list with the rest of the parent's memory).
      @paused = []
    end

    # What a control request to the parent must carry from another host.
    def control_token = Runner.control_token(@config)

    # The classes paused through the parent's endpoint.
    def paused = @lock.synchronize { @paused.dup }

    # Remember (or forget) a pause for the workers forked from now on.
    def note_paused(name, paused)
      @lock.synchronize { paused ? (@paused |= [name]) : @paused.delete(name) }
    end

    # Fork, supervise until told to stop, drain. Returns the exit status.
    def run
      if @consumers.empty?
        raise AMQP::ConfigurationError, "no consumers to run: define a subclass of AceMQ::Rails::Consumer with a queue (in app/consumers)"
      end

      Runner.check_pool(@consumers)
      compact
      trap_signals
      start_health
      @logger.info("acemq: supervising #{processes_text(@processes)} (pid #{Process.pid}, #{compaction_note}" \
                   "#{@health_port ? ", health on :#{@health_port}" : ''})")
      @children.each { |c| spawn(c) }
      @state = :running
      supervise
    ensure
      @health&.close
      FileUtils.rm_f(@config.health_file) if @config.health_file
    end

    def stopping? = @stopping

    # Ask the parent to stop, as TERM does (from another thread).
    def stop = signal("TERM")

    # What /status answers, and what /ready and /live are decided from.
    def snapshot
      @lock.synchronize do
        { state: @state, pid: Process.pid, processes: @processes, quiet: @quiet, beat: @beat,
          children: @children.map { |c| c.to_h.slice(:index, :pid, :state, :health_port, :last_exit, :started_at).merge(total_restarts: c.total_restarts) } }
      end
    end

    def given_up? = @state == :failed

    # Whether the supervising loop has gone round lately.
    def beating? = @beat && Process.clock_gettime(Process::CLOCK_MONOTONIC) - @beat <= @check * 3 + 1

    private

    # Objects moved together before forking stay shared after it: without
    # compaction the first GC in each child writes to pages the parent's
    # heap fragments sit on, and they are copied. Skipped where a loaded
    # extension keeps a Ruby object in a C global the GC does not know of:
    # mysql2 before 0.5.4 holds Mysql2::Error that way (its PR #1115), so a
    # compacted parent would give every child a dangling class.
    def compact
      @compacted = false
      return @compaction_skipped = "GC.compact unavailable" unless GC.respond_to?(:compact)

      if defined?(::Mysql2::VERSION) && Gem::Version.new(::Mysql2::VERSION) < Gem::Version.new("0.5.4")
        return @compaction_skipped = "mysql2 #{::Mysql2::VERSION} < 0.5.4 is not compaction-safe"
      end

      3.times { GC.start(full_mark: true, immediate_sweep: true) }
      GC.compact
      @compacted = true
    end

    def compaction_note = @compacted ? "heap compacted" : "heap not compacted: #{@compaction_skipped}"

    def trap_signals
      SIGNALS.each do |sig|
        Signal.trap(sig) do
          if %w[TERM INT].include?(sig)
            # A second one while draining: sent on, and the children exit at once.
            @stopping = true
          end
          signal(sig)
        end
      end
    end

    def signal(sig)
      @signal_out.write_nonblock("#{sig}\n", exception: false)
    end

    def start_health
      return if @config.health_port.nil?

      @health = Health.new(self, host: @config.health_host.to_s, port: Integer(@config.health_port))
      @health_port = @health.port
    end

    def touch_health_file
      path = @config.health_file
      return unless path

      given_up? ? FileUtils.rm_f(path) : FileUtils.touch(path)
    end

    def supervise
      terms = 0
      loop do
        @lock.synchronize { @beat = Process.clock_gettime(Process::CLOCK_MONOTONIC) }
        reports = @children.map(&:report).compact
        ready = IO.select([@signal_in, *reports], nil, nil, @check)&.first || []
        signals = ready.include?(@signal_in) ? @signal_in.read_nonblock(4096, exception: false).to_s.split("\n") : []
        (ready - [@signal_in]).each { |io| read_report(io) }
        stops = signals.count { |s| %w[TERM INT].include?(s) }
        if stops.positive?
          terms += stops
          return shutdown(signals.find { |s| %w[TERM INT].include?(s) }) if terms == stops
        end
        forward("TSTP") && (@quiet = true) if signals.include?("TSTP")
        forward("TTIN") if signals.include?("TTIN")
        status = reap
        return status if status

        restart_due
        touch_health_file
      end
    end

    # "booted PORT" from a child once its runner is running.
    def read_report(io)
      child = @children.find { |c| c.report == io }
      data = io.read_nonblock(4096, exception: false)
      if data.nil? # the child closed it: exiting, or gone
        io.close
        child.report = nil if child
        return
      end
      return unless child && data.is_a?(String)

      data.scan(/booted (\d+)/) do |(port)|
        @lock.synchronize do
          child.health_port = Integer(port).zero? ? nil : Integer(port)
          child.state = :running
        end
      end
    end

    def forward(sig)
      @children.each { |c| kill(sig, c.pid) if c.pid }
      @logger.info("acemq: #{sig} sent to every process#{sig == 'TSTP' ? ': quiet (TERM to stop)' : ''}")
      true
    end

    def kill(sig, pid)
      Process.kill(sig, pid)
    rescue Errno::ESRCH
      nil
    end

    # Children that exited since the last look: restarted, or the budget is
    # spent and everything stops.
    def reap
      loop do
        pid, status = Process.wait2(-1, Process::WNOHANG)
        return nil unless pid

        child = @children.find { |c| c.pid == pid }
        next unless child

        how = status.exitstatus ? "exited #{status.exitstatus}" : "killed by SIG#{Signal.signame(status.termsig.to_i)}"
        died(child, how)
        return give_up(child, how) if child.state == :failed
      end
    rescue Errno::ECHILD
      nil
    end

    def died(child, how)
      now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      @lock.synchronize do
        child.last_exit = how
        child.pid = nil
        child.health_port = nil
        after = child.budget.spend
        if after.nil?
          child.state = :failed
          @state = :failed
        else
          child.state = :restarting
          child.restart_at = now + after
          @logger.error("acemq: process #{child.index} #{how}; forking it again in #{after.round(1)}s")
        end
      end
    end

    def give_up(child, how)
      reason = "process #{child.index} #{how}; restarted #{child.budget.recent} times within #{child.budget.window.round}s, giving up"
      @logger.error("acemq: #{reason}")
      shutdown("TERM", at_least: EXIT_GAVE_UP)
    end

    def restart_due
      now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      @children.each { |c| spawn(c) if c.state == :restarting && now >= c.restart_at }
    end

    # TERM to every child, then wait for each until the deadline; KILL what
    # is left. The status says the worst of what happened.
    def shutdown(sig, at_least: EXIT_CLEAN)
      @stopping = true
      @lock.synchronize { @state = :stopping if @state != :failed }
      timeout = Float(@config.shutdown_timeout || AMQP::NativeSupervisor::RUNNER_DEFAULTS.fetch(:shutdown_timeout))
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout + KILL_GRACE
      live = @children.select(&:pid)
      @logger.info("acemq: stopping #{processes_text(live.size)}: letting running handlers finish (up to #{timeout.round}s)")
      live.each { |c| kill(sig, c.pid) }
      status = at_least
      terms_seen = 1
      until live.empty?
        live.reject! do |c|
          pid, st = Process.wait2(c.pid, Process::WNOHANG)
          next false unless pid

          c.pid = nil
          c.last_exit = st.exitstatus ? "exited #{st.exitstatus}" : "killed by SIG#{Signal.signame(st.termsig.to_i)}"
          c.state = :stopped
          status = [status, EXIT_UNFINISHED].max unless st.success?
          true
        rescue Errno::ECHILD
          true
        end
        break if live.empty?

        if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          live.each do |c|
            @logger.error("acemq: process #{c.index} (pid #{c.pid}) did not stop within shutdown_timeout; killing it")
            kill("KILL", c.pid)
            Process.wait(c.pid) rescue nil # rubocop:disable Style/RescueModifier
            c.pid = nil
            c.state = :stopped
            c.last_exit = "killed by SIGKILL"
          end
          status = EXIT_KILLED
          break
        end
        # A second TERM or INT: the operator means now; the children hear it too.
        if IO.select([@signal_in], nil, nil, 0.05)
          more = @signal_in.read_nonblock(4096, exception: false).to_s.split("\n").count { |s| %w[TERM INT].include?(s) }
          if more.positive? && terms_seen < 2
            terms_seen = 2
            live.each { |c| kill(sig, c.pid) }
          end
        end
      end
      @lock.synchronize { @state = :stopped unless @state == :failed }
      @logger.info("acemq: stopped (exit #{status})")
      status
    end

    def processes_text(n) = n == 1 ? "1 process" : "#{n} processes"

    # Fork one child. In it: drop the parent's pipes and sockets, hold off
    # signals until the runner takes them, run on_worker_boot, then run a
    # Runner, and report its health port back when it is running.
    def spawn(child)
      report_in, report_out = IO.pipe
      parent = Process.pid
      pid = fork do
        report_in.close
        child_main(child.index, parent, report_out)
      end
      report_out.close
      @lock.synchronize do
        child.pid = pid
        child.report = report_in
        child.state = :booting
        child.health_port = nil
        child.started_at = Time.now.utc.round.iso8601
      end
      @logger.info("acemq: process #{child.index} forked (pid #{pid})")
    end

    def child_main(index, parent, report)
      # Until the runner traps them: TERM or INT ends a boot that has handled
      # nothing yet; TSTP must not stop (suspend) the process.
      early_stop = false
      %w[TERM INT].each { |s| Signal.trap(s) { exit!(0) } }
      Signal.trap("TSTP") { early_stop = true }
      Signal.trap("TTIN", "IGNORE")
      Signal.trap("CHLD", "DEFAULT")
      # The parent's: the signal pipe, the other children's reports, the
      # health socket. Closed here, never written.
      [@signal_in, @signal_out, *@children.map(&:report)].compact.each { |io| io.close rescue nil } # rubocop:disable Style/RescueModifier
      @health&.close_in_child
      $PROGRAM_NAME = "acemq worker #{index} (parent #{parent})"
      config = @config
      parent_port = config.health_port
      # A child's endpoint is for the parent only.
      config.health_port = parent_port.nil? ? nil : 0
      config.health_host = "127.0.0.1"
      config.health_file = nil
      config.on_worker_boot&.call(index)
      runner = Runner.new(consumers: @consumers, config: config, executor: @executor, paused: @paused,
                          booted: lambda { |r|
                            report.write("booted #{r.health_port || 0}\n")
                            r.quiet if early_stop || @quiet
                          })
      watch_parent(runner, parent)
      status = runner.run
      finish(status, report)
    rescue Exception => e # rubocop:disable Lint/RescueException
      @logger.error("acemq: process #{index} failed: #{e.class}: #{e.message}") unless e.is_a?(SystemExit)
      finish(e.is_a?(SystemExit) ? e.status : 1, report)
    end

    # exit!, not exit: at_exit hooks and finalizers would run in the child on
    # objects the parent opened (a PG::Connection's finalizer sends the
    # server Terminate on the socket the parent shares). The runner has
    # already closed what the child opened.
    def finish(status, report)
      $stdout.flush
      $stderr.flush
      report.close rescue nil # rubocop:disable Style/RescueModifier
      exit!(status)
    end

    # A parent killed with KILL cannot TERM its children: each stops itself
    # when it sees it has been reparented.
    def watch_parent(runner, parent)
      Thread.new do
        sleep 0.5 while Process.ppid == parent
        @logger.error("acemq: the parent (pid #{parent}) is gone; stopping")
        runner.stop
      end
    end
  end
end
