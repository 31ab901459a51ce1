# frozen_string_literal: true

# `rake soak`: every error path AceMQ has, driven N times on ONE connection
# with good traffic between, on a private RabbitMQ node and on memory://.
# After each path the same connection must still declare, publish and
# consume (a round trip on a fresh queue), and what the process and the
# broker hold must be back where it was: channels (the client's and the
# broker's count for this connection), descriptors, threads, tokio tasks,
# RSS. docs/lifecycle.md ("Failed operations: the soak") has the
# tolerances and why.
#
#   ruby drill/soak.rb                    # short: about 3 minutes
#   SOAK=long ruby drill/soak.rb          # 10,000 per path, then SOAK_MINUTES (60) of mixed traffic
#   SOAK_TRANSPORTS=memory ruby drill/soak.rb
#   SOAK_N=200 ruby drill/soak.rb         # every path 200 times (a quick look)
#   SOAK_RUST=skip ruby drill/soak.rb     # without core/examples/soak.rs
#   SOAK_DEBUG=1 ruby drill/soak.rb       # where each path spent its time
#
# Exits 0 when everything held, 1 with the reasons otherwise.
require_relative "soak/support"
require_relative "soak/broker"
require_relative "soak/transport"
require_relative "soak/mixed"
require "rbconfig"

module Soak
  ROOT = File.expand_path("..", __dir__)

  # N per path in the short mode: about 3 minutes for both transports on
  # two cores. The paths that close or retire a channel per operation on
  # RabbitMQ (a passive check of a missing queue, a publish to a missing
  # exchange, a nacked publish) go past its channel_max of 2,047: issue 47
  # broke a connection there.
  SHORT = {
    "missing_queue" => 2_500, "missing_exchange" => 2_500, "bind_missing_exchange" => 500, "unroutable" => 1_000,
    "nacked" => 2_500, "oversized" => 300, "denied" => 1_000, "precondition" => 1_000, "consumer_missing" => 300,
    "consumer_deleted" => 100, "handler_raises" => 500, "handler_rejects" => 1_000, "handler_retries" => 500,
    "handler_overruns" => 120, "request_timeout" => 300, "dead_letters_missing" => 1_500, "reconnect" => 300
  }.freeze
  LONG_N = 10_000
  # SOAK_ROUNDS for core/examples/soak.rs in the short mode: its own
  # default, operations per path.
  RUST_ROUNDS = 500

  # RSS a path may add, in MB: what the allocator keeps after a burst of
  # work (arenas, lapin's buffers, Ruby's heap), not per operation. A leak
  # of 10 KB per operation (a channel's state) shows as 25 MB over 2,500.
  RSS_LIMIT_MB = { "short" => 30, "long" => 60 }.freeze

  def self.main
    $stdout.sync = true
    mode = ENV.fetch("SOAK", "short")
    abort "soak: SOAK is short or long, not #{mode.inspect}" unless %w[short long].include?(mode)
    long = mode == "long"
    sizes = SHORT.transform_values { |n| long ? LONG_N : n }
    sizes = sizes.transform_values { Integer(ENV["SOAK_N"]) } if ENV["SOAK_N"]
    minutes = Float(ENV.fetch("SOAK_MINUTES", "60"))
    memory_minutes = Float(ENV.fetch("SOAK_MEMORY_MINUTES", [minutes, 10].min.to_s))
    transports = ENV.fetch("SOAK_TRANSPORTS", "rabbitmq,memory").split(",").map(&:strip)
    unknown = transports - %w[rabbitmq memory]
    abort "soak: unknown transport(s) #{unknown.join(', ')}: rabbitmq, memory" unless unknown.empty?
    path_limit = long ? 3_600 : 180
    limit = Float(ENV.fetch("SOAK_LIMIT", long ? (24 * 3600).to_s : "900"))

    t0 = now
    watchdog # started before anything is counted: its thread is in every count
    say "soak: #{mode} mode; N per path: #{sizes.map { |k, n| "#{k} #{n}" }.join(', ')}"
    say "soak: tolerances after a settle of up to #{SETTLE}s (#{BROKER_SETTLE}s for the broker's count): " \
        "#{TOLERANCE.map { |k, v| "#{k} +#{v}" }.join(', ')}; RSS +#{RSS_LIMIT_MB[mode]} MB a path" +
        (long ? "; mixed traffic #{minutes} min on RabbitMQ, #{memory_minutes} min on memory://" : "")
    runs = []
    failures = []
    rust = nil
    begin
      bounded(limit, "the soak (SOAK_LIMIT)") do
        trap("TERM") { Thread.main.raise(Interrupt) }
        if transports.include?("rabbitmq")
          broker = Broker.new
          begin
            say format("soak: private node %s on 127.0.0.1:%d up in %.1fs (user soak, max_message_size %d)",
                       broker.name, broker.port, broker.start, Broker::MAX_MESSAGE_SIZE)
            runs << run(TransportRun.new(label: "rabbitmq", url: broker.url, broker: broker, sizes: sizes,
                                         limit: path_limit, rss_limit_mb: RSS_LIMIT_MB[mode], long: long),
                        long && minutes, failures)
            rust = rust_soak(broker, long ? LONG_N : RUST_ROUNDS, long) unless ENV["SOAK_RUST"] == "skip"
          ensure
            broker.destroy
          end
        end
        if transports.include?("memory")
          runs << run(TransportRun.new(label: "memory", url: "memory://soak-#{Process.pid}", broker: nil, sizes: sizes,
                                       limit: path_limit, rss_limit_mb: RSS_LIMIT_MB[mode], long: long),
                      long && memory_minutes, failures)
        end
      end
    rescue Hang, Interrupt, Drill::Failure => e
      failures << (e.is_a?(Interrupt) ? "interrupted" : e.message)
    end
    summary(runs, rust, failures, now - t0, mode)
  end

  def self.run(transport, minutes, failures)
    transport.call do |r|
      next unless minutes

      mixed = Mixed.new(r, minutes).call
      failures.concat(mixed.failures)
    end
    failures.concat(transport.failures.map { |f| "#{transport.label}: #{f}" })
    transport
  rescue StandardError => e
    failures << "#{transport.label}: #{e.class}: #{e.message} (at #{e.backtrace&.first})"
    transport
  end

  # core/examples/soak.rs, the same soak through core alone, against the
  # same node as the soak user: built if its source is there, skipped (not
  # failed) while it is not. [state, text].
  def self.rust_soak(broker, rounds, long)
    target = ENV.fetch("CARGO_TARGET_DIR", File.join(ROOT, "target"))
    bin = File.join(target, "release", "examples", "soak")
    if File.exist?(File.join(ROOT, "core", "examples", "soak.rs"))
      t = now
      unless system("cargo", "build", "--locked", "--release", "-p", "acemq", "--example", "soak", chdir: ROOT)
        return [:failed, "cargo build --release -p acemq --example soak failed"]
      end

      say format("soak: rust: built target/release/examples/soak in %.1fs", now - t)
    elsif !File.executable?(bin)
      say "soak: rust: skipped: core/examples/soak.rs does not exist yet (nor #{bin})"
      return [:skipped, "core/examples/soak.rs does not exist yet"]
    end

    t = now
    say "soak: rust: AMQP_URL=#{broker.url} SOAK_ROUNDS=#{rounds} SOAK_MAX_MESSAGE=#{Broker::MAX_MESSAGE_SIZE} #{bin}"
    env = { "AMQP_URL" => broker.url, "SOAK_ROUNDS" => rounds.to_s, "SOAK_DENIED_EXCHANGE" => Broker::DENIED,
            "SOAK_MAX_MESSAGE" => Broker::MAX_MESSAGE_SIZE.to_s }
    pid = spawn(env, bin, out: $stdout, err: $stderr, chdir: ROOT)
    limit = long ? 4 * 3_600 : 600
    status = nil
    Soak.poll(limit, interval: 0.1) { status = Process.wait2(pid, Process::WNOHANG)&.last }
    unless status
      Process.kill("KILL", pid)
      Process.wait(pid)
      return [:failed, "examples/soak ran past #{limit}s and was killed"]
    end
    text = format("exit %d after %.1fs", status.exitstatus || -1, now - t)
    say "soak: rust: #{text}"
    [status.success? ? :passed : :failed, text]
  end

  def self.summary(runs, rust, failures, seconds, mode)
    rows = runs.flat_map(&:rows)
    say ""
    say header
    rows.each { |r| say row_line(r) }
    skipped = rows.select(&:skipped)
    say ""
    skipped.each { |r| say "skipped on #{r.transport}: #{r.title}: #{r.skipped}" }
    say "rust soak (core/examples/soak.rs): #{rust ? "#{rust[0]}: #{rust[1]}" : 'not run'}" if rust || runs.any? { |r| r.label == "rabbitmq" }
    bad = rows.reject(&:ok?)
    bad.each { |r| r.failures.each { |f| failures << "#{r.transport} #{r.key}: #{f}" } }
    failures << "rust soak: #{rust[1]}" if rust && rust[0] == :failed
    say format("soak: %s, %s mode, in %.1fs", failures.empty? ? "passed" : "FAILED", mode, seconds)
    failures.each { |f| say "  #{f}" }
    failures.empty? ? 0 : 1
  end

  def self.say(line = "") = $stdout.puts(line)
end

exit Soak.main if $PROGRAM_NAME == __FILE__
