# frozen_string_literal: true

# `rake drill`: faults on a private RabbitMQ node, with runners charging
# through the shipped ActiveRecord store on PostgreSQL, and the accounting
# after each: nothing lost, nothing charged twice.
#
#   ruby drill/run.rb                      # every phase
#   DRILL_PHASES=kill,poison ruby drill/run.rb
#   DRILL_SEED=1234 ruby drill/run.rb      # the same victims again
#
# Exits 0 when every phase passed, 1 with the reasons otherwise. Every wait
# is bounded; DRILL_LIMIT (default 300 s) bounds the whole run.
require_relative "support"
require_relative "node"
require_relative "phases"
require_relative "database_phases"
require_relative "swarm"
require_relative "ordering"
require_relative "dead_letter_phases"

module Drill
  # How long a dead runner's claim holds its message back. Short, so the
  # drill sees takeovers; long enough that a live handler slowed down by a
  # busy machine (its connection cut under it) is never taken over.
  CLAIM_TIMEOUT = 2
  # Each charge holds its transaction open this long: the runners keep a
  # backlog, and a kill or a cut connection lands mid-transaction.
  WORK_SECONDS = 0.01

  # Raised in the main thread when the drill outlives DRILL_LIMIT. Not a
  # StandardError, so no phase can take it for one of its own failures and
  # carry on.
  class Overrun < Exception; end # rubocop:disable Lint/InheritException
  PHASES = { "kill" => KillRunners, "close" => CloseConnections, "restart" => RestartBroker,
             "relays" => KillRelays, "poison" => PoisonFlood, "db" => DatabaseOutage,
             "swarm" => KillSwarmChild, "order" => PartitionOrder, "deadletters" => DeadLetterIngest }.freeze

  def self.main
    $stdout.sync = true
    names = ENV.fetch("DRILL_PHASES", PHASES.keys.join(",")).split(",").map(&:strip)
    unknown = names - PHASES.keys
    abort "drill: unknown phase(s) #{unknown.join(', ')}: choose from #{PHASES.keys.join(', ')}" unless unknown.empty?
    if DATABASE_URL.start_with?("mysql2:") && !(names - MYSQL_PHASES).empty?
      abort "drill: on MySQL (DATABASE_URL=#{DATABASE_URL}) only #{MYSQL_PHASES.join(', ')} run: " \
            "#{(names - MYSQL_PHASES).join(', ')} use PostgreSQL; choose with DRILL_PHASES"
    end

    seed = Integer(ENV.fetch("DRILL_SEED", Random.new_seed % 100_000))
    t0 = now
    results = []
    failure = bounded("drill", Float(ENV.fetch("DRILL_LIMIT", "300"))) do |made|
      node = made[:broker] = Node.new
      say "drill: seed #{seed}; private node #{node.name} on 127.0.0.1:#{node.port}; " \
          "#{DATABASE_URL.start_with?('mysql2:') ? 'MySQL' : 'PostgreSQL'} " \
          "#{DATABASE_URL.sub(%r{//[^@]*@}, '//')}; claim timeout #{CLAIM_TIMEOUT}s"
      up = node.start
      say format("drill: node up in %.1fs", up)
      db = made[:db] = Drill.database
      rng = Random.new(seed)
      tag = "#{Process.pid}#{SecureRandom.hex(2)}"
      names.each do |name|
        r = PHASES.fetch(name).new(node: node, db: db, rng: rng, tag: tag).call
        results << r
        say line(r)
      end
    end
    if failure
      results << failure
      say "drill: #{failure.failure}"
    end
    summary(results, now - t0, seed)
    results.all?(&:ok?) && results.size == names.size ? 0 : 1
  end

  # Run a drill's body bounded by `limit` seconds: past it, or on TERM, the
  # main thread is interrupted, cleanup still runs, and CI gets a failure
  # rather than a hang. The body puts what it makes in `made` (:db, the
  # drill's database; :broker, its node, cluster or lab), and whatever was
  # made is dropped and destroyed at the end. nil, or a failing Result named
  # `who` when the body raised a Failure, overran or was interrupted.
  def self.bounded(who, limit)
    t0 = now
    made = {}
    main = Thread.current
    watchdog = Thread.new do
      sleep limit
      main.raise(Overrun, "the drill ran past DRILL_LIMIT (#{limit.round}s)")
    end
    trap("TERM") { main.raise(Interrupt) }
    yield made
    nil
  rescue Failure, Overrun, Interrupt => e
    Result.new(phase: who, failure: e.is_a?(Interrupt) ? "interrupted" : e.message, seconds: now - t0)
  ensure
    watchdog&.kill
    Children.reap_all
    begin
      made[:db]&.drop_all
    rescue StandardError => e # PG::Error, Mysql2::Error
      warn "#{who}: dropping tables: #{e.message}"
    end
    made[:broker]&.destroy
  end

  def self.line(r)
    figures = "#{r.messages.to_i} messages, #{r.faults} faults, #{r.lost || '?'} lost, #{r.doubled || '?'} doubled"
    figures += ", #{r.wire_dups} duplicates on the wire" if r.wire_dups
    figures += ", #{r.recovery}" if r.recovery && r.recovery != "-"
    figures += "; #{r.notes}" if r.notes
    format("%-6s %-26s %s (%.1fs)", r.ok? ? "ok" : "FAILED", r.phase, figures, r.seconds.to_f) +
      (r.ok? ? "" : "\n       #{r.failure}")
  end

  def self.summary(results, seconds, seed)
    say ""
    row = "%-26s %8s %6s %5s %7s %9s  %-9s %-7s %s"
    say format(row, "phase", "messages", "faults", "lost", "doubled", "wire dups", "recovery", "time", "result")
    results.each do |r|
      say format(row, r.phase, r.messages.to_i, r.faults.to_i, r.lost || "?", r.doubled || "?", r.wire_dups || "-",
                 r.worst ? format("%.2fs", r.worst) : "-", format("%.1fs", r.seconds.to_f), r.ok? ? "ok" : "FAILED")
    end
    failed = results.reject(&:ok?)
    say format("drill: %s in %.1fs (seed %d)", failed.empty? ? "passed" : "FAILED", seconds, seed)
    failed.each { |r| say "  #{r.phase}: #{r.failure}" }
  end
end

exit Drill.main if $PROGRAM_NAME == __FILE__
