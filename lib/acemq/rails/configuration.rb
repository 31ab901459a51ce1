# frozen_string_literal: true

module AceMQ
  module Rails
    # What `AceMQ::Rails.configure { |c| ... }` sets, usually in
    # config/initializers/acemq.rb. Every setting has a default; the runner
    # reads them when it boots.
    class Configuration
      # The broker. Default: ENV["AMQP_URL"], then the local broker.
      attr_writer :url
      # Seconds a shutdown lets running handlers finish (default core's
      # RunnerOptions shutdown_timeout: under the 30 s most platforms give
      # between SIGTERM and SIGKILL).
      attr_accessor :shutdown_timeout
      # Health endpoint: port (nil: none; 0: any free port), host (default
      # 0.0.0.0 so a probe from outside the container reaches it).
      attr_accessor :health_port, :health_host
      # What a control request (POST /consumers/NAME/pause) from another host
      # must carry as Authorization: Bearer; default ACEMQ_CONTROL_TOKEN.
      # Without one they are taken from 127.0.0.1 only (docs/flow.md).
      attr_accessor :control_token
      # A file touched on every check while the runner is live, and
      # removed when it stops: for an exec probe (`find FILE -mmin -1`).
      attr_accessor :health_file
      # Seconds between the runner's checks of its consumers (default core's
      # RunnerOptions heartbeat).
      attr_accessor :check_interval
      # The AMQP heartbeat in seconds (default: the broker's, 60 s).
      attr_accessor :heartbeat
      # The broker's consumer_timeout in seconds, when it is not RabbitMQ's
      # default (core's DEFAULT_BROKER_CONSUMER_TIMEOUT): every consumer's
      # timeout must be shorter.
      attr_accessor :consumer_timeout
      # TLS for an amqps:// url, as Connection.open takes it: { ca_file:,
      # cert_file:, key_file:, server_name:, verify: }. Given to every
      # connection AceMQ opens (the runner's two, the publisher, the rake
      # tasks). nil (the default) with amqps:// is the system's CA store.
      attr_accessor :tls
      # Seconds a subscription may be without a channel before it counts as
      # failed and is restarted (default core's RunnerOptions
      # recovery_bound), and the restart budget: at most max_restarts within
      # restart_window seconds (core's RestartPolicy::default(), in
      # NativeSupervisor::RESTART_DEFAULTS), then the runner exits non-zero.
      attr_accessor :recovery_bound, :max_restarts, :restart_window
      # The connection's name on the broker (default: the application's name).
      attr_writer :origin
      attr_accessor :connect_timeout, :confirm_timeout
      # Consumer classes to run (default: every subclass of
      # AceMQ::Rails::Consumer with a queue, after eager loading).
      attr_accessor :consumers
      # An OutboxRelay run beside the consumers on the publishing
      # connection: a store (or a callable building one), nil for none.
      attr_accessor :outbox, :outbox_interval
      # The dead-letter store the runner ingests every consumer's DLQ into
      # (docs/dead-letters.md): an AMQP::SQLDeadLetterStore, a callable
      # returning one (called in each runner process, after any fork, so a
      # connection it opens is the process's own), or :active_record for one
      # on ActiveRecord::Base's pool and the tables `acemq:install`
      # migrates. nil (the default): no ingester.
      attr_accessor :dead_letter_store
      # Retention the ingesters keep per queue: rows that failed more than
      # dead_letter_max_age seconds ago, and beyond dead_letter_max_count
      # rows, are pruned (each ingester every dead_letter_prune_every
      # seconds, default 60). nil (the default): kept until discarded.
      attr_accessor :dead_letter_max_age, :dead_letter_max_count, :dead_letter_prune_every
      # Seconds between a standby ingester's asks for its DLQ (the store's
      # default, 5): at most this long with nobody ingesting after the
      # runner that had it went.
      attr_accessor :dead_letter_retry_every
      attr_writer :logger
      # Worker processes `acemq run` forks (default 1: no fork, the runner
      # runs in the process itself). `acemq run --processes N` overrides it.
      # Each process runs every consumer with its concurrency, so the
      # threads (and the database pool they need) are per process.
      attr_accessor :processes

      # A block run in each forked worker process (`--processes` above 1),
      # after the fork and before its runner connects, with the process's
      # index (0...processes): reopen there what the application opened
      # while booting in the parent.
      def on_worker_boot(&block)
        @on_worker_boot = block if block
        @on_worker_boot
      end

      # The runner's and the relay's defaults are core's, read through the
      # extension (RunnerOptions, RelayOptions::DEFAULT_INTERVAL).
      def initialize
        runner = AMQP::NativeSupervisor::RUNNER_DEFAULTS
        @shutdown_timeout = runner.fetch(:shutdown_timeout)
        @health_host = "0.0.0.0"
        @check_interval = runner.fetch(:heartbeat)
        @outbox_interval = AMQP::Patterns::OutboxRelay::DEFAULT_INTERVAL
      end

      def url = @url || ENV.fetch("AMQP_URL", "amqp://guest:guest@localhost:5672")

      def origin
        return @origin if @origin
        if defined?(::Rails.application) && ::Rails.application
          # MyApp::Application -> "my_app"; an application class at top level has no module.
          app = ::Rails.application.class
          return (app.module_parent_name || app.name).to_s.underscore
        end

        File.basename($PROGRAM_NAME)
      end

      def logger
        @logger ||= if defined?(::Rails.logger) && ::Rails.logger
                      ::Rails.logger
                    else
                      require "logger"
                      Logger.new($stdout)
                    end
      end
    end
  end
end
