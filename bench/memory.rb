# frozen_string_literal: true

# Issue 12: memory per open amqp:// connection. A child process opens one
# connection (so the client's code, threads and runtime are paid for), takes
# its resident set, opens 50 more, waits for them to settle, takes it again,
# and reports the growth per connection. acemq and Bunny run in separate
# children, alternated, and the medians are reported.
#
#   rake bench                 # builds the release extension, runs every bench
#   ruby bench/memory.rb       # this file alone (the extension must be built)
#
# AMQP_URL, BENCH_RUNS (default 3). RSS is VmRSS from /proc/self/status after
# a GC, so freed Ruby objects are not counted on either side.

require_relative "common"

module MemoryBench
  C = BenchCommon
  CONNECTIONS = 50
  PATH = "memory per open amqp:// connection (RSS, 50 connections)"
  TARGET_KB = 1024.0

  def self.rss_kb = File.read("/proc/self/status")[/VmRSS:\s+(\d+)/, 1].to_i

  # In the child: kilobytes of RSS each of CONNECTIONS connections added.
  def self.child(side)
    open = case side
           when "acemq" then -> { AceMQ::AMQP::Connection.open(C::URL, origin: "acemq-bench-memory") }
           when "bunny" then -> { Bunny.new(C::URL, logger: Logger.new(nil)).tap(&:start) }
           end
    first = open.call
    GC.start
    sleep 0.5
    before = rss_kb
    conns = Array.new(CONNECTIONS) { open.call }
    # Heartbeat timers and I/O threads start asynchronously: let them.
    sleep 1
    GC.start
    after = rss_kb
    ([first] + conns).each(&:close)
    (after - before) / CONNECTIONS.to_f
  end

  def self.measure(side)
    out = IO.popen([RbConfig.ruby, __FILE__, "--child", side], &:read)
    raise "memory child #{side} failed (#{$?.exitstatus}): #{out}" unless $?.success?

    Float(out.lines.last)
  end

  def self.run
    C.banner("bench/memory.rb")
    kb = Hash.new { |h, k| h[k] = [] }
    C::RUNS.times { %w[acemq bunny].each { |side| kb[side] << measure(side) } }
    acemq = C.median(kb["acemq"])
    bunny = C.median(kb["bunny"])
    puts format("RSS per open connection, %d connections, median of %d: acemq %.0f KB (%s), Bunny %.0f KB (%s)",
                CONNECTIONS, C::RUNS, acemq, kb["acemq"].map(&:round).join(" "), bunny, kb["bunny"].map(&:round).join(" "))
    C::Table.row(path: PATH, result: format("%.2f MB (Bunny: %.2f MB)", acemq / 1024, bunny / 1024),
                 target: "<= 1 MB", pass: acemq <= TARGET_KB,
                 bound: acemq <= TARGET_KB ? nil : "see bench/README.md, memory")
  end
end

if ARGV[0] == "--child"
  puts MemoryBench.child(ARGV[1])
else
  MemoryBench.run
end
