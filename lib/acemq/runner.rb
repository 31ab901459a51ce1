# frozen_string_literal: true

require "fileutils"

module AceMQ
  # One consumer process: every consumer class on one consuming connection,
  # a second connection to publish on, a health endpoint, and signals.
  # `acemq run` and `bin/rails acemq:run` build one and call #run.
  #
  # What it decides (restart or give up, ready or not, how long a shutdown
  # drains) is the engine's supervisor (core's acemq::runner), so a Rust
  # service gets the same rules; the threads, the signals and the log lines
  # are here.
  #
  # Signals: TERM or INT stops taking deliveries, lets running handlers
  # finish within shutdown_timeout, settles them and exits 0 (1 when some had
  # to be abandoned: their messages go back to the queue, unacknowledged); a
  # second TERM or INT exits at once. TSTP: quiet (no new deliveries, the
  # process stays up; TERM to finish). TTIN: every thread's backtrace to the
  # log.
  class Runner
    SIGNALS = %w[TERM INT TSTP TTIN].freeze

    # #pause or #resume named a class this runner does not run.
    class UnknownConsumer < ArgumentError; end

    attr_reader :consumers, :supervisor, :health_port

    # booted: is called with the runner once it is running (every consumer
    # subscribed, the health endpoint up): how a forked child of
    # `acemq run --processes N` tells its parent its health port.
    # paused: consumer class names to pause before they take anything (a
    # worker forked after a pause through the --processes parent).
    def initialize(consumers:, config: AceMQ::Rails.config, executor: nil, booted: nil, paused: [])
      @consumers = consumers
      @paused_at_boot = paused.map(&:to_s)
      @booted = booted
      @config = config
      @executor = executor
      @logger = config.logger
      @supervisor = AMQP::NativeSupervisor._new(
        shutdown_timeout: config.shutdown_timeout && Float(config.shutdown_timeout),
        recovery_bound: config.recovery_bound && Float(config.recovery_bound),
        **Runner.restart_rule(config).then { |r| { max_restarts: r[:max_restarts], restart_window: r[:window] } },
        heartbeat: Runner.check_interval(config), control_token: Runner.control_token(config)
      )
      @slots = []
      # Signals arrive on a pipe: a trap handler may not take a lock, and
      # the main loop waits on the pipe with the check interval as its timeout.
      @signal_in, @signal_out = IO.pipe
      @stopping = false
    end

    # Boot, run until told to stop, shut down. Returns the exit status:
    # 0 after a clean shutdown, 1 when it gave up or had to abandon handlers.
    def run
      boot
      trap_signals
      loop_until_stopped
    rescue AMQP::ConfigurationError, AMQP::Error => e
      # Anything of ours at boot (a pool too small, a broker down, a queue
      # declared with other arguments elsewhere) is a reason, not a crash.
      @supervisor._fail(e.message)
      @logger.error("acemq: cannot start: #{e.message}")
      shutdown
      1
    end

    # Whether the runner has been asked to stop (a signal, or #stop).
    def stopping? = @stopping

    # Ask the running loop to shut down, as TERM does (from another thread).
    def stop = signal("TERM")

    # Stop taking deliveries and keep running, as TSTP does.
    def quiet = signal("TSTP")

    # Pause one consumer class by name, at run time, and keep the others
    # running: it takes nothing more, what it had buffered goes back to the
    # queue with no attempt spent, handlers in progress finish. It stays
    # paused across a restart of its subscription, until #resume, and is
    # reported as paused (not down) in /status; /ready stays 200. The same
    # as POST /consumers/NAME/pause on the health endpoint and
    # `acemq ctl pause NAME`. Raises UnknownConsumer (an ArgumentError) for a name not run here.
    #
    #   runner.pause("PaymentsConsumer")
    def pause(name) = control { @supervisor._pause(name.to_s) }

    # Take deliveries again after #pause.
    def resume(name) = control { @supervisor._resume(name.to_s) }

    def paused?(name) = control { @supervisor._paused?(name.to_s) }

    # config.control_token, else ACEMQ_CONTROL_TOKEN: what a control request
    # to the health endpoint from another host must carry (Authorization:
    # Bearer). Without one, control requests are taken from 127.0.0.1 only.
    # Seconds between the runner's checks: config.check_interval, else
    # core's (RunnerOptions heartbeat).
    def self.check_interval(config)
      Float(config.check_interval || AMQP::NativeSupervisor::RUNNER_DEFAULTS.fetch(:heartbeat))
    end

    # max_restarts: and restart_window: as core takes them (the runner's
    # supervisor, the --processes parent's RestartBudget): digits in a
    # String (an environment variable) read as numbers; anything else as
    # given, for core's check to refuse by name (1.5 restarts is not 1).
    def self.restart_rule(config)
      number = ->(v, kind) { v.is_a?(String) ? (Kernel.public_send(kind, v.strip, exception: false) || v) : v }
      { max_restarts: number.(config.max_restarts, :Integer), window: number.(config.restart_window, :Float) }
    end

    def self.control_token(config)
      token = config.respond_to?(:control_token) ? config.control_token : nil
      token ||= ENV.fetch("ACEMQ_CONTROL_TOKEN", nil)
      token&.to_s
    end

    private

    def control
      yield
    rescue AMQP::ConfigurationError => e
      raise UnknownConsumer, e.message
    end

    def boot
      raise AMQP::ConfigurationError, "no consumers to run: define a subclass of AceMQ::Rails::Consumer with a queue (in app/consumers)" if @consumers.empty?

      check_pool
      @consume = AMQP::Connection.open(@config.url, origin: "#{@config.origin}:consume",
                                                    connect_timeout: @config.connect_timeout,
                                                    confirm_timeout: @config.confirm_timeout,
                                                    heartbeat: @config.heartbeat, tls: @config.tls)
      # Publishing on a connection of its own: RabbitMQ blocks publishing
      # connections under a memory or disk alarm, and the consumers must keep
      # draining (which is what clears the alarm) while it does.
      @publish = AMQP::Connection.open(@config.url, origin: "#{@config.origin}:publish",
                                                    connect_timeout: @config.connect_timeout,
                                                    confirm_timeout: @config.confirm_timeout,
                                                    heartbeat: @config.heartbeat, tls: @config.tls)
      AceMQ::Rails.publisher = @publish
      @consumers.each do |klass|
        klass.topology.apply(@consume)
        # One instance for the life of the process: the guide's consumers
        # memoise their guard in it.
        instance = klass.new
        # A partitioned class is one subscription per partition queue, each
        # a slot of its own (all under the class's name, for pause).
        klass.consume_queues.each do |queue|
          index = @supervisor._register(klass.name, queue, klass.partitions ? 1 : klass.concurrency, klass.prefetch || 0)
          # Recorded before it subscribes: _attach pauses it at once.
          @supervisor._pause(klass.name) if @paused_at_boot.include?(klass.name)
          slot = { klass: klass, index: index, instance: instance, queue: queue, subscription: nil, restart_at: nil }
          slot[:subscription] = subscribe(slot)
          @supervisor._attach(index, slot[:subscription].native)
          @slots << slot
        end
        d = klass.describe
        # The sizes each subscription runs with (the engine's defaults filled
        # in), not what the class asked: a partitioned class runs one
        # handler per partition queue, whatever its concurrency says.
        slot = JSON.parse(@supervisor.status_json)["consumers"][@slots.last[:index]]
        parts = d[:partitions] ? "#{d[:partitions]} partitions, each " : ""
        @logger.info("acemq: #{d[:name]} on #{d[:queue]} (#{parts}concurrency #{slot['concurrency']}, prefetch " \
                     "#{slot['prefetch']}#{d[:batch] > 1 ? ", batch #{d[:batch]}" : ''}" \
                     "#{d[:bindings].empty? ? '' : ", bound to #{d[:bindings].join(' ')}"}" \
                     "#{d[:idempotent] ? ', idempotent' : ''})")
      end
      start_relay
      start_dead_letters
      start_health
      @supervisor._running
      @booted&.call(self)
      @logger.info("acemq: running #{@slots.size} consumer#{@slots.size == 1 ? '' : 's'} (pid #{Process.pid}, " \
                   "shutdown_timeout #{@config.shutdown_timeout}s#{@health_port ? ", health on :#{@health_port}" : ''})")
    end

    def subscribe(slot)
      klass = slot[:klass]
      on_error = ->(error) { @logger.warn("acemq: #{klass.name}: #{error.class}: #{error.message}") }
      klass.subscribe(@consume, instance: slot[:instance], around: @executor, on_error: on_error,
                                consumer_timeout: @config.consumer_timeout, queue: slot[:queue])
    end

    # Every handler thread that touches ActiveRecord holds a connection for
    # its call; a pool smaller than the threads is a handler that waits for
    # a connection and times out under load, so it is refused at boot.
    def check_pool = Runner.check_pool(@consumers)

    # Also what `--processes N`'s parent asks before it forks: a pool too
    # small is refused once, not by every worker in a restart loop. Reading
    # the pool's size opens no connection.
    def self.check_pool(consumers)
      return unless defined?(::ActiveRecord::Base) && ::ActiveRecord::Base.respond_to?(:connection_pool)

      pool = begin
        ::ActiveRecord::Base.connection_pool
      rescue StandardError
        return
      end
      threads = consumers.sum(&:threads)
      # A dead-letter store on the same pool: each ingester takes a
      # connection for every batch it commits.
      ingesters = AceMQ::Rails.config.dead_letter_store == :active_record ? consumers.flat_map(&:consume_queues).uniq.size : 0
      threads += ingesters
      return if pool.size >= threads

      raise AMQP::ConfigurationError,
            "the ActiveRecord pool has #{pool.size} connections and the consumers run #{threads} threads " \
            "(#{consumers.map { |k| "#{k.name} #{k.threads}" }.join(', ')}" \
            "#{ingesters.positive? ? ", #{ingesters} dead-letter ingesters" : ''}): set pool: #{threads} (or more) " \
            "in config/database.yml, e.g. RAILS_MAX_THREADS=#{threads}, or lower a consumer's concurrency"
    end

    def start_relay
      store = AceMQ::Rails.outbox_store
      return unless store

      @relay = AMQP::Patterns::OutboxRelay.new(
        @publish, store, interval: @config.outbox_interval,
                         on_error: lambda { |error, exchange:, routing_key:|
                           @logger.warn("acemq: outbox stuck on #{exchange}/#{routing_key}: #{error.message}")
                         }
      )
      @relay.start
      @logger.info("acemq: outbox relay every #{@config.outbox_interval}s")
    end

    # One ingester per DLQ of the consumers run here (a partitioned class's
    # every partition queue has its own), on the consuming connection: it
    # publishes nothing, and the exclusive consume that makes it the one
    # ingester is let go with that connection. Every runner starts them, each forked
    # worker of --processes too, and the broker's exclusive consume lets one
    # have each DLQ: the others stand by and take over when its connection
    # goes. That is why nothing here elects a leader.
    def start_dead_letters
      store = AceMQ::Rails.dead_letter_store
      return unless store

      retention = { max_age: @config.dead_letter_max_age, max_count: @config.dead_letter_max_count }.compact
      options = retention.merge(logger: @logger)
      options[:prune_every] = @config.dead_letter_prune_every if @config.dead_letter_prune_every
      options[:retry_every] = @config.dead_letter_retry_every if @config.dead_letter_retry_every
      queues = @consumers.flat_map(&:consume_queues).uniq
      @ingesters = queues.map do |queue|
        ingester = store.ingest(@consume, queue, **options)
        @supervisor._ingester("#{queue}.dlq", "starting", 0, nil)
        { ingester: ingester, dlq: "#{queue}.dlq", state: "starting" }
      end
      kept = retention.empty? ? "kept until discarded" : retention.map { |k, v| "#{k} #{v}" }.join(", ")
      @logger.info("acemq: dead letters of #{@ingesters.map { _1[:dlq] }.join(', ')} into the store " \
                   "(one ingester per DLQ across runners, the others stand by; #{kept})")
    end

    # Each ingester's state into /status, and a line when one starts
    # ingesting (at boot, or taking over from a runner that went). Standing
    # by (once) and each failure are the ingester's own lines (its logger:).
    def report_dead_letters
      (@ingesters || []).each do |slot|
        ing = slot[:ingester]
        state = if ing.active? then "ingesting"
                elsif ing.standby? then "standby"
                elsif ing.last_error then "retrying"
                else slot[:state] == "stopped" ? "stopped" : "starting"
                end
        if state != slot[:state]
          @logger.info("acemq: ingesting #{slot[:dlq]} into the dead-letter store") if state == "ingesting"
          slot[:state] = state
        end
        # An error it has since got past is not news.
        @supervisor._ingester(slot[:dlq], state, ing.received, state == "ingesting" ? nil : ing.last_error&.message)
      end
    end

    # Asked together, then waited for: a batch being inserted is committed
    # and acknowledged first; what is not yet in one goes back to the DLQ.
    def stop_dead_letters(deadline)
      return unless @ingesters

      @ingesters.each { |s| s[:ingester].stop(timeout: 0) }
      @ingesters.each do |s|
        s[:ingester].stop(timeout: [deadline - Time.now, 1].max)
        s[:state] = "stopped"
        @supervisor._ingester(s[:dlq], "stopped", s[:ingester].received, nil)
      end
    end

    def start_health
      touch_health_file
      return if @config.health_port.nil?

      @health_port = @supervisor._serve_health(@config.health_host.to_s, Integer(@config.health_port))
    end

    def touch_health_file
      path = @config.health_file
      return unless path

      @supervisor.live? ? FileUtils.touch(path) : FileUtils.rm_f(path)
    end

    def trap_signals
      @previous = {}
      SIGNALS.each do |sig|
        @previous[sig] = Signal.trap(sig) do
          # A second TERM or INT while draining: the operator means now.
          exit!(1) if @stopping && %w[TERM INT].include?(sig)
          @stopping = true if %w[TERM INT].include?(sig)
          signal(sig)
        end
      rescue ArgumentError
        nil # a platform without the signal
      end
    end

    def restore_signals
      @previous&.each { |sig, handler| Signal.trap(sig, handler || "DEFAULT") }
    end

    def signal(sig)
      @signal_out.write_nonblock("#{sig}\n", exception: false)
    end

    def loop_until_stopped
      loop do
        ready = IO.select([@signal_in], nil, nil, Runner.check_interval(@config))
        signals = ready ? @signal_in.read_nonblock(4096, exception: false).to_s.split("\n") : []
        return shutdown if signals.any? { |sig| %w[TERM INT].include?(sig) }

        go_quiet if signals.include?("TSTP")
        dump_threads if signals.include?("TTIN")
        status = tick
        return status if status
      end
    end

    # One look at every consumer; the supervisor decides.
    def tick
      @supervisor._beat
      touch_health_file
      report_dead_letters
      @slots.each do |slot|
        if slot[:restart_at]
          restart(slot) if Time.now >= slot[:restart_at]
          next
        end
        sub = slot[:subscription]
        down_for = sub.down_for
        say_channel(slot, sub, down_for)
        verdict = @supervisor._observe(slot[:index], ended: sub.ended, dead_workers: sub.dead_workers, down_for: down_for,
                                                     last_error: sub.failure)
        if verdict.restart?
          @logger.error("acemq: #{verdict.reason}; restarting in #{verdict.after.round(1)}s")
          # Closed on a thread of its own: closing waits for the handlers
          # still running on its other threads, and this loop must go on
          # beating meanwhile or the runner stops being live.
          sub.stop_taking
          Thread.new { close_quietly(sub) }
          slot[:restart_at] = Time.now + verdict.after
        elsif verdict.give_up?
          @logger.error("acemq: #{verdict.reason}")
          shutdown
          return 1
        end
      end
      nil
    end

    # A loss that outlasts a check gets a line when it starts and one when it
    # ends; a short one is reported by the subscription itself, through the
    # consumer's on_error (the log), when it has subscribed again.
    def say_channel(slot, sub, down_for)
      name = slot[:klass].name
      if down_for && !slot[:down]
        slot[:down] = true
        @logger.warn("acemq: #{name} lost its channel (#{sub.failure || 'connection closed'}); subscribing again")
      elsif down_for.nil? && slot[:down]
        slot[:down] = false
        @logger.info("acemq: #{name} subscribed again")
      end
    end

    def restart(slot)
      slot[:subscription] = subscribe(slot)
      # Paused here first if an operator paused the class.
      @supervisor._attach(slot[:index], slot[:subscription].native)
      slot[:restart_at] = nil
      slot[:down] = false
      @supervisor._restarted(slot[:index])
      @logger.info("acemq: #{slot[:klass].name} subscribed again")
    rescue AMQP::Error => e
      @logger.error("acemq: #{slot[:klass].name} could not subscribe again: #{e.message}")
      slot[:restart_at] = nil # the next tick observes it as down and asks the supervisor
      slot[:subscription] = DeadSubscription.new(e.message)
    end

    def go_quiet
      return if @quiet

      @quiet = true
      @supervisor._quiet
      @slots.each { |s| s[:subscription].stop_taking }
      @logger.info("acemq: quiet: taking no new deliveries (TERM to stop)")
    end

    def dump_threads
      Thread.list.each do |t|
        @logger.warn("acemq: thread #{t.name || t.object_id} #{t.status}\n  #{(t.backtrace || ['(none)']).join("\n  ")}")
      end
    end

    # Stop taking deliveries everywhere first, then wait for the handlers
    # running now, until the supervisor's deadline. What has not finished by
    # then is never acknowledged: closing the connection gives it back to the
    # broker, which delivers it again.
    def shutdown
      @stopping = true
      remaining = @supervisor._stopping
      deadline = Time.now + remaining
      @logger.info("acemq: stopping: letting running handlers finish (up to #{remaining.round}s)")
      subs = @slots.map { |s| s[:subscription] }.compact
      subs.each(&:stop_taking)
      @relay&.close
      stop_dead_letters(deadline)
      unfinished = subs.sum { |s| s.drain(deadline) }
      if unfinished.zero?
        subs.each { |s| close_quietly(s) }
        @logger.info("acemq: stopped")
      else
        @logger.warn("acemq: #{unfinished} handler#{unfinished == 1 ? '' : 's'} did not finish within " \
                     "shutdown_timeout (#{@config.shutdown_timeout}s): their messages go back to the queue")
      end
      [@publish, @consume].compact.each { |c| c.close rescue nil } # rubocop:disable Style/RescueModifier
      @supervisor._close_health
      @supervisor._stopped
      FileUtils.rm_f(@config.health_file) if @config.health_file
      restore_signals
      @supervisor.failure || !unfinished.zero? ? 1 : 0
    end

    def close_quietly(sub)
      sub.cancel
    rescue StandardError => e
      @logger.warn("acemq: closing #{sub.queue}: #{e.message}")
    end

    # Stands in for a subscription that could not be made, so the next tick
    # reports it to the supervisor as down.
    class DeadSubscription
      attr_reader :failure

      def initialize(failure)
        @failure = failure
        @since = Time.now
      end

      def ended = nil
      def dead_workers = 0
      def down_for = Time.now - @since
      def queue = "(none)"
      def stop_taking = nil
      def drain(_deadline) = 0
      def cancel = nil
    end
    private_constant :DeadSubscription
  end
end
