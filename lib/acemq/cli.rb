# frozen_string_literal: true

require "optparse"
# The errors before anything else: boot raises ConfigurationError (no
# config/environment.rb) before the application has required acemq.
require "acemq/errors"

module AceMQ
  # `acemq`: the runner's command line.
  #
  #   acemq run                   # from a Rails app's root: boots config/environment.rb
  #   acemq run -r ./consumers.rb # an app without Rails: requires the file instead
  #   acemq run --only PaymentsConsumer,RefundsConsumer
  #   acemq status                # the same consumers' queues, DLQs, outbox
  #   acemq status --queue shop.payments --json
  class CLI
    USAGE = <<~TEXT
      Usage: acemq run [options]
             acemq status [options]
             acemq web [options]
             acemq ctl pause|resume NAME [--runner URL]

      run: runs the consumers (subclasses of AceMQ::Rails::Consumer) until TERM
      or INT. From a Rails application's root it boots config/environment.rb;
      elsewhere give -r with the file that defines the consumers and calls
      AceMQ::Rails.configure.

      Signals: TERM/INT drain and exit (a second one exits at once), TSTP quiet,
      TTIN thread backtraces to the log. With --processes N the parent forks N
      runners after booting, restarts one that dies, sends signals on, and
      exits 0 clean, 1 handlers abandoned, 2 restart budget spent, 3 a process
      killed at the deadline (docs/lifecycle.md).

      status: what the broker, the outbox and the runner's metrics say now
      about the same consumers (or about --queue NAME, without booting an
      app): ready, unacked, consumers, rate, rung queues, DLQ depth and its
      newest reasons, the outbox backlog, the duplicate rate.

      web: the dashboard (AceMQ::Web) on WEBrick, for an app without Rails
      (a Rails app mounts it in config/routes.rb): the same consumers (or
      --queue NAME), their dead letters, replay and discard. No
      authentication of its own: bind it to 127.0.0.1 (the default) or put
      it behind one (docs/web.md).

      ctl: pause or resume one consumer class in a running runner (or every
      worker of --processes N), through its health endpoint: --runner URL
      (repeatable; default http://127.0.0.1:9394), ACEMQ_CONTROL_TOKEN sent
      as the bearer token when set (docs/flow.md).
    TEXT

    def self.start(argv = ARGV, out: $stdout, err: $stderr) = new(out: out, err: err).start(argv)

    def initialize(out:, err:)
      @out = out
      @err = err
    end

    # Returns the exit status.
    def start(argv)
      # Log lines reach a container's log (a pipe, not a terminal) as they
      # are written, not when a buffer fills or the process exits.
      $stdout.sync = true
      $stderr.sync = true
      options = { require: [], only: nil, dir: nil, queues: [], interval: 1.0, json: false }
      parser = OptionParser.new do |o|
        o.banner = USAGE
        o.separator ""
        o.on("-r", "--require FILE", "Require FILE instead of ./config/environment.rb (repeatable)") { |f| options[:require] << f }
        o.on("-C", "--chdir DIR", "Change to DIR first") { |d| options[:dir] = d }
        o.on("--processes N", Integer, "Fork N worker processes, each running the consumers (default: config.processes, else 1)") do |n|
          options[:processes] = n
        end
        o.on("--only NAMES", "Run (or show) only these consumer classes (comma-separated)") { |n| options[:only] = n }
        o.separator ""
        o.separator "status:"
        o.on("--queue NAME", "Show this queue (repeatable); boots no app") { |q| options[:queues] << q }
        o.on("--url URL", "The broker (default: the app's config.url, else AMQP_URL)") { |u| options[:url] = u }
        o.on("--metrics URL", "The runner's /metrics (default: config.health_port's); none") { |u| options[:metrics] = u }
        o.on("--interval SECONDS", Float, "Between the two samples a rate is taken from (default 1)") do |s|
          options[:interval] = s
        end
        o.on("--rabbitmqctl CMD", "How to run rabbitmqctl for unacked (default: when local); none") do |c|
          options[:rabbitmqctl] = c
        end
        o.on("--json", "A JSON document instead of the table") { options[:json] = true }
        o.separator ""
        o.separator "web:"
        o.on("--port PORT", Integer, "Listen on PORT (default 9395)") { |p| options[:port] = p }
        o.on("--host HOST", "Listen on HOST (default 127.0.0.1)") { |h| options[:host] = h }
        o.on("--runner URL", "A runner's health endpoint to show (repeatable; default config.health_port's)") do |u|
          (options[:runners] ||= []) << u
        end
        o.on("--read-only", "Show, never change") { options[:read_only] = true }
        o.on("--management URL", "The management API (http://user:pass@host:15672/): counts, unacked, ages, rungs") do |u|
          options[:management] = u
        end
        o.on("--rungs DELAYS", "The retry rungs of each --queue (e.g. 1s,2s,4s; default: from --management, else none)") do |r|
          options[:rungs] = r.split(",").map(&:strip).reject(&:empty?)
        end
        o.on("--read-within SECONDS", Float, "A DLQ filter gives up after this long, saying how far it read (default 5)") do |s|
          options[:read_within] = s
        end
        o.on("--dead-letter-store PATH_OR_URL",
             "Store mode: the DLQ pages read this dead-letter store (a SQLite file, or a postgres:// or mysql2:// URL)") do |s|
          options[:dead_letter_store] = s
        end
        o.on("--replay-rate N", Float, "Store mode: messages a second a replay sends (default 50)") { |r| options[:replay_rate] = r }
        o.separator ""
        o.on("-v", "--version", "Print the version") do
          @out.puts("acemq #{AceMQ::VERSION}")
          return 0
        end
        o.on("-h", "--help", "This text") do
          @out.puts(o)
          return 0
        end
      end
      args = parser.parse(argv)
      command = args.shift
      return ctl(args, options) if command == "ctl"

      unless %w[run status web].include?(command)
        @err.puts(command ? "acemq: unknown command #{command.inspect}\n\n#{parser}" : parser.to_s)
        return command ? 64 : 0
      end
      Dir.chdir(options[:dir]) if options[:dir]
      return status(options) if command == "status"
      return web(options) if command == "web"

      boot(options[:require])
      AceMQ::Rails.runner(only: options[:only], processes: options[:processes]).run
    rescue OptionParser::ParseError, AceMQ::AMQP::ConfigurationError => e
      @err.puts("acemq: #{e.message}")
      64
    end

    private

    # --queue alone needs no application: the names say what to look at.
    def status(options)
      options[:queues].empty? || !options[:require].empty? ? boot(options[:require]) : require("acemq")
      require "acemq/status/command"
      AceMQ::Status::Command.new(out: @out, err: @err, queues: options[:queues], only: options[:only],
                                 url: options[:url], metrics: options[:metrics], interval: options[:interval],
                                 rabbitmqctl: options[:rabbitmqctl], json: options[:json]).run
    end

    # TERM or INT stops it at once: the server stops listening, and a
    # request still running (a DLQ read) is not waited for longer than
    # Server::STOP_WITHIN; closing the connection gives back whatever a read
    # held. (WEBrick alone waits for every request thread, a browser's
    # idle keep-alive connection among them.)
    def web(options)
      options[:queues].empty? || !options[:require].empty? ? boot(options[:require]) : require("acemq")
      require "acemq/web"
      require "acemq/web/server"
      settings = { url: options[:url], runners: options[:runners], read_only: options[:read_only],
                   management_url: options[:management], rungs: options[:rungs], read_within: options[:read_within],
                   dead_letter_store: options[:dead_letter_store], replay_rate: options[:replay_rate] }.compact
      # "none" turns it off, as for acemq status; any other command is run.
      settings[:rabbitmqctl] = options[:rabbitmqctl] if options[:rabbitmqctl] && options[:rabbitmqctl] != "none"
      settings[:queues] = options[:queues] unless options[:queues].empty?
      begin
        app = AceMQ::Web.new(**settings)
      rescue AceMQ::AMQP::ConfigurationError => e
        @err.puts("acemq: #{e.message}")
        return 64
      end
      # A store given here that cannot be opened (a mistyped URL, no tables)
      # is said now, not on the first page. The app's own (config's) is not
      # asked: with its database down the rest of the dashboard still serves.
      if options[:dead_letter_store]
        begin
          app.source.dead_letter_store.audit(limit: 1)
        rescue StandardError => e
          @err.puts("acemq: --dead-letter-store: #{e.message}")
          return 64
        end
      end
      server = AceMQ::Web::Server.new(app, host: options[:host] || "127.0.0.1", port: options[:port] || 9395, log: @err)
      stop_r, stop_w = IO.pipe
      %w[INT TERM].each { |sig| trap(sig) { stop_w.write_nonblock(".", exception: false) } }
      @out.puts("acemq web: http://#{options[:host] || '127.0.0.1'}:#{server.port}/")
      serving = Thread.new { server.start }
      stop_r.wait_readable until !serving.alive? || stop_r.read_nonblock(1, exception: false).is_a?(String)
      server.stop
      app.close
      0
    end

    def ctl(args, options)
      action, name = args
      unless %w[pause resume].include?(action) && name
        @err.puts("acemq: ctl takes pause NAME or resume NAME (a consumer class name), e.g. acemq ctl pause PaymentsConsumer")
        return 64
      end
      require "acemq/control"
      urls = options[:runners] || ["http://127.0.0.1:9394"]
      urls.each { |u| @out.puts("#{u}: #{AceMQ::Control.new(u).public_send(action, name)}") }
      0
    rescue AceMQ::Control::Refused => e
      @err.puts("acemq: #{e.message}")
      e.code == 404 ? 65 : 1
    rescue AceMQ::Control::Unreachable => e
      @err.puts("acemq: no runner answered at #{e.message} (is it running with a health_port? give --runner URL)")
      1
    rescue AceMQ::Control::InvalidURL, AceMQ::Control::InvalidRequest => e
      @err.puts("acemq: #{e.message}")
      64
    end

    def boot(files)
      if files.empty?
        env = File.expand_path("config/environment.rb")
        unless File.exist?(env)
          raise AceMQ::AMQP::ConfigurationError,
                "no config/environment.rb in #{Dir.pwd}: run from the Rails app's root (or -C DIR), " \
                "or give -r FILE for an app without Rails"
        end
        require env
      else
        files.each { |f| require File.expand_path(f) }
      end
      require "acemq"
    end
  end
end
