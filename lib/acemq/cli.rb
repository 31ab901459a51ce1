# frozen_string_literal: true

require "optparse"

module AceMQ
  # `acemq`: the runner's command line.
  #
  #   acemq run                   # from a Rails app's root: boots config/environment.rb
  #   acemq run -r ./consumers.rb # an app without Rails: requires the file instead
  #   acemq run --only PaymentsConsumer,RefundsConsumer
  class CLI
    USAGE = <<~TEXT
      Usage: acemq run [options]

      Runs the consumers (subclasses of AceMQ::Rails::Consumer) until TERM or INT.
      From a Rails application's root it boots config/environment.rb; elsewhere
      give -r with the file that defines the consumers and calls
      AceMQ::Rails.configure.

      Signals: TERM/INT drain and exit (a second one exits at once), TSTP quiet,
      TTIN thread backtraces to the log.
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
      options = { require: [], only: nil, dir: nil }
      parser = OptionParser.new do |o|
        o.banner = USAGE
        o.separator ""
        o.on("-r", "--require FILE", "Require FILE instead of ./config/environment.rb (repeatable)") { |f| options[:require] << f }
        o.on("-C", "--chdir DIR", "Change to DIR first") { |d| options[:dir] = d }
        o.on("--only NAMES", "Run only these consumer classes (comma-separated)") { |n| options[:only] = n }
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
      unless command == "run"
        @err.puts(command ? "acemq: unknown command #{command.inspect}\n\n#{parser}" : parser.to_s)
        return command ? 64 : 0
      end
      Dir.chdir(options[:dir]) if options[:dir]
      boot(options[:require])
      AceMQ::Rails.runner(only: options[:only]).run
    rescue OptionParser::ParseError, AceMQ::AMQP::ConfigurationError => e
      @err.puts("acemq: #{e.message}")
      64
    end

    private

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
