# frozen_string_literal: true

# What bench/idempotency.rb and bench/outbox.rb share: the extension to load,
# the broker and database addresses, the 1 KiB payload, medians, a latch.
# (bench/run.rb predates this file and keeps its own copies.)

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
# `rake bench` points this at a private copy of the extension it just built.
$LOAD_PATH.unshift(File.expand_path(ENV["ACEMQ_BENCH_EXT"])) if ENV["ACEMQ_BENCH_EXT"]
require "acemq"
require "acemq/amqp/patterns"
require "bunny"
require "fileutils"
require "time"
require "json"
require "logger"
require "pg"
require "securerandom"
require "sqlite3"

module BenchCommon
  URL = ENV.fetch("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
  PG_URL = ENV.fetch("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/test")
  # Fewer runs than bench/run.rb by default: every run here also writes to a
  # database, and the three files together should stay within a few minutes.
  RUNS = Integer(ENV.fetch("BENCH_RUNS", "3"))
  SCALE = Float(ENV.fetch("BENCH_SCALE", "1"))
  PREFETCH = 100
  # A run that has not finished by then is a hang, not a slow result.
  RUN_LIMIT = 120

  Ack = AceMQ::AMQP::Ack
  Patterns = AceMQ::AMQP::Patterns

  def self.count(n) = [(n * SCALE).round, 16].max

  def self.payload(i)
    base = {
      "order_id" => format("A-%08d", i),
      "customer" => { "id" => 4217, "name" => "Ada Lovelace", "email" => "ada@example.com" },
      "items" => [{ "sku" => "BK-001", "qty" => 2, "price" => 1250 }, { "sku" => "PN-042", "qty" => 1, "price" => 399 }],
      "currency" => "EUR",
      "note" => ""
    }
    @filler ||= "x" * (1024 - JSON.generate(base).bytesize)
    base.merge("note" => @filler)
  end

  PAYLOADS = Array.new(64) { |i| payload(i) }.freeze
  raise "payload is not 1 KiB" unless JSON.generate(PAYLOADS[0]).bytesize == 1024

  def self.now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def self.median(xs)
    s = xs.sort
    s.size.odd? ? s[s.size / 2] : (s[s.size / 2 - 1] + s[s.size / 2]) / 2.0
  end

  # Seconds the block took, after a GC so that one side does not pay for
  # the other's garbage.
  def self.time
    GC.start
    t = now
    yield
    now - t
  end

  # Runs every side once per round, RUNS rounds, so that whatever else the
  # machine does falls on all of them; returns the median rate per side.
  # sides: { name => -> { seconds } }, n: items per run.
  def self.alternate(n, sides)
    rates = Hash.new { |h, k| h[k] = [] }
    RUNS.times { sides.each { |name, run| rates[name] << n / run.call } }
    rates.transform_values { |xs| median(xs) }
  end

  # A SQLite file in WAL mode with a busy timeout, through the Ruby driver.
  def self.sqlite(path, synchronous)
    db = SQLite3::Database.new(path)
    db.busy_timeout = 10_000
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = #{synchronous}")
    db
  end

  # The command name and CPU so far (user + system, microseconds) in a
  # /proc stat file (a process's or a thread's); nil once it has ended.
  def self.proc_cpu(stat_path)
    stat = File.read(stat_path)
    fields = stat[(stat.rindex(")") + 2)..].split
    [stat[/\((.*)\)/, 1], (fields[11].to_i + fields[12].to_i) * 1e6 / 100] # CLK_TCK is 100 on Linux
  rescue Errno::ENOENT, Errno::ESRCH
    nil
  end

  def self.banner(title)
    puts "#{title}: #{URL.sub(%r{//[^@]*@}, '//')}, #{PG_URL.sub(%r{//[^@]*@}, '//')}, median of #{RUNS} runs, " \
         "Ruby #{RUBY_VERSION}, Bunny #{Bunny::VERSION}, sqlite3 gem #{SQLite3::VERSION} " \
         "(libsqlite3 #{SQLite3::SQLITE_VERSION}), pg gem #{PG::VERSION}"
    so = $LOADED_FEATURES.find { |f| f.end_with?("/acemq.so") && f.include?("acemq/") }
    puts format("extension: %s (%.1f MB%s)", so, File.size(so) / 1e6,
                File.size(so) > 20e6 ? ", looks like a debug build: figures will be low" : "")
  end

  # Waits for a count to reach a target, with a limit (Ruby 3.1's Queue#pop has none).
  # What a bench runner makes and must leave behind it: its queues (deleted
  # through @admin), PostgreSQL tables, open handles, the temp dir, and its
  # two connections.
  # The broker's queues whose names start with `prefix`, from rabbitmqctl
  # when it is on this machine (the shared broker is); none otherwise.
  def self.queues_named(prefix)
    out = IO.popen(%w[rabbitmqctl list_queues -q --no-table-headers name], err: File::NULL, &:read)
    $?.success? ? out.lines.map(&:strip).select { |q| q.start_with?(prefix) } : []
  rescue SystemCallError
    []
  end

  # Delete each of `queues` on `channel` (a new one after a refusal, which
  # closes it); the channel to go on with.
  def self.delete_queues(bunny, channel, queues)
    queues.each do |q|
      channel.queue_delete(q)
    rescue Bunny::Exception
      channel = bunny.create_channel
    end
    channel
  end

  module Cleanup
    # The connections, names and scratch space of a run called `name`.
    def setup_resources(name)
      @mq = AceMQ::AMQP::Connection.open(BenchCommon::URL, origin: "acemq-bench")
      @bunny = Bunny.new(BenchCommon::URL, logger: Logger.new(nil))
      @bunny.start
      @admin = @bunny.create_channel
      tag = "#{Process.pid}_#{SecureRandom.hex(3)}"
      @prefix = "acemq-bench-#{name}-#{tag}"
      @table_prefix = "bench_#{name}_#{tag}"
      @dir = File.expand_path("../tmp/bench-#{name}-#{tag}", __dir__)
      FileUtils.mkdir_p(@dir)
      @queues = []
      @pg_tables = []
      @closers = []
      @rows = []
    end

    # A PostgreSQL connection closed with the run.
    # A Mysql2::Client on BENCH_MYSQL_URL, closed at the end of the run.
    def mysql
      conn = BenchCommon.mysql_client
      @closers << conn
      conn
    end

    def pg
      conn = PG.connect(BenchCommon::PG_URL)
      conn.exec("SET client_min_messages = warning")
      @closers << conn
      conn
    end

    def cleanup
      # Consuming declares each queue's retry rungs too ({q}.retry.1s, …):
      # whatever this run named with its prefix goes.
      @queues.concat(BenchCommon.queues_named(@prefix)) if @prefix
      @admin = BenchCommon.delete_queues(@bunny, @admin, @queues.uniq)
      unless @mysql_tables.to_a.empty?
        admin = BenchCommon.mysql_client
        @mysql_tables.uniq.each { |t| admin.query("DROP TABLE IF EXISTS #{t}") }
        admin.close
      end
      unless @pg_tables.to_a.empty?
        admin = PG.connect(BenchCommon::PG_URL)
        @pg_tables.uniq.each { |t| admin.exec("DROP TABLE IF EXISTS #{t}") }
        admin.close
      end
      @closers.to_a.each { |c| c.close rescue nil } # rubocop:disable Style/RescueModifier
      FileUtils.rm_rf(@dir) if @dir
      @mq&.close
      @bunny&.close
    end
  end

  class Latch
    def initialize(target)
      @target = target
      @count = 0
      @lock = Mutex.new
      @cond = ConditionVariable.new
    end

    attr_reader :count

    def hit
      @lock.synchronize do
        @count += 1
        @cond.broadcast if @count >= @target
      end
    end

    def wait(limit)
      deadline = BenchCommon.now + limit
      @lock.synchronize do
        while @count < @target
          left = deadline - BenchCommon.now
          raise "timed out with #{@count}/#{@target} after #{limit}s" if left <= 0

          @cond.wait(@lock, left)
        end
      end
    end
  end

  # Raw lapin from Rust (core/examples/bench.rs, `bench raw`): the most any
  # client gets from this broker, one timed run on `queue` (declared by the
  # caller; preloaded with n messages for :consume). Returns msg/s. Its
  # connect happens before its clock starts, so the process start is not in
  # the figure. `rake bench` builds the binary; BENCH_LAPIN points elsewhere.
  LAPIN = ENV.fetch("BENCH_LAPIN", File.expand_path("../target/release/examples/bench", __dir__))

  def self.lapin(kind, queue, n)
    raise "#{LAPIN} is missing: run `cargo build --release --example bench` (rake bench does)" unless File.executable?(LAPIN)

    out = IO.popen({ "AMQP_URL" => URL }, [LAPIN, "raw", kind.to_s, queue, n.to_s], &:read)
    raise "bench raw #{kind} failed (#{$?.exitstatus}): #{out}" unless $?.success?

    JSON.parse(out.lines.last)["rate"]
  end

  # The issue-12 table: every script adds the rows it measured (one JSON
  # object a line, in ACEMQ_BENCH_ROWS, default tmp/bench/rows.jsonl), and
  # bench/table.rb prints them together at the end of `rake bench`.
  module Table
    FILE = ENV.fetch("ACEMQ_BENCH_ROWS", File.expand_path("../tmp/bench/rows.jsonl", __dir__))

    # path: what is measured; result: the figure as printed ("33.4k/s =
    # 0.74x"); target: as printed (">= 0.90x"); pass: true/false; bound:
    # what limits a miss, when known.
    def self.row(path:, result:, target:, pass:, bound: nil)
      FileUtils.mkdir_p(File.dirname(FILE))
      File.open(FILE, "a") do |f|
        f.puts JSON.generate(path: path, result: result, target: target, pass: pass, bound: bound,
                             at: Time.now.utc.iso8601)
      end
      puts format("  table: %-60s %-28s %-10s %s", path, result, target, pass ? "pass" : "MISS")
    end

    # A ratio row: ours and base in msg/s, target the least ratio.
    def self.ratio(path:, ours:, base:, target:, base_name: nil, bound: nil)
      ratio = ours / base
      result = format("%s = %.2fx%s", rate(ours), ratio, base_name ? " (#{base_name} #{rate(base)})" : "")
      row(path: path, result: result, target: format(">= %.2fx", target), pass: ratio >= target, bound: bound)
      ratio
    end

    def self.rate(x) = x >= 1000 ? format("%.1fk/s", x / 1000.0) : format("%.0f/s", x)
  end

  # The baseline's own SQL, straight through the Ruby driver: `?` for
  # SQLite, `$n` for PostgreSQL.
  # MariaDB here (BENCH_MYSQL_URL, default the local server's `test`), in
  # utf8mb4 as the stores require.
  MYSQL_URL = ENV.fetch("BENCH_MYSQL_URL", "mysql2://root@127.0.0.1:3306/test")

  def self.mysql_client
    require "mysql2"
    require "uri"
    u = URI(MYSQL_URL)
    Mysql2::Client.new(host: u.host, port: u.port || 3306, username: u.user, password: u.password,
                       database: u.path.delete_prefix("/"), encoding: "utf8mb4")
  end

  class Raw
    def self.for(conn)
      if conn.is_a?(PG::Connection) then PgRaw.new(conn)
      elsif conn.respond_to?(:affected_rows) then MysqlRaw.new(conn)
      else SqliteRaw.new(conn)
      end
    end
  end

  # The one-statement claim a hand-written consumer runs: rows changed is 1
  # when this INSERT added the key.
  CLAIM_ONE = "INSERT INTO %s (message_id, state, claimed_by, recorded_at, expires_at) " \
              "VALUES (?, 'CLAIMED', ?, ?, ?) ON CONFLICT (message_id) DO NOTHING"

  # mysql2 through the same escape-and-query path the store's adapter uses.
  class MysqlRaw
    def initialize(conn)
      @conn = conn
      @adapter = AceMQ::AMQP::SQL::MySQL.new(conn)
    end

    def postgres? = false
    # The benches write "timestamp" as PostgreSQL and SQLite quote it; MySQL
    # reads that as a string, so it is backquoted, as the engine does.
    def execute(sql, params = []) = @adapter.execute(sql.tr('"', "`"), params)
    def query(sql, params = []) = @adapter.query(sql.tr('"', "`"), params)

    # MySQL's form of CLAIM_ONE: a no-op update of a taken key changes no
    # row (mysql2 does not count found rows unless asked), so 1 is still
    # "added".
    def claim_one(t)
      "INSERT INTO #{t} (message_id, state, claimed_by, recorded_at, expires_at) " \
        "VALUES (?, 'CLAIMED', ?, ?, ?) ON DUPLICATE KEY UPDATE message_id = message_id"
    end

    def transaction
      @conn.query("BEGIN")
      r = yield
      @conn.query("COMMIT")
      r
    rescue Exception # rubocop:disable Lint/RescueException
      @conn.query("ROLLBACK")
      raise
    end
  end

  class SqliteRaw
    def initialize(db) = @db = db
    def postgres? = false
    def claim_one(t) = format(CLAIM_ONE, t)

    # Rows changed.
    def execute(sql, params = [])
      @db.execute(sql, params)
      @db.changes
    end

    def query(sql, params = []) = @db.execute(sql, params)
    def transaction(&block) = @db.transaction(&block)
  end

  class PgRaw
    def initialize(conn) = @conn = conn
    def postgres? = true
    def claim_one(t) = format(CLAIM_ONE, t)

    def execute(sql, params = [])
      r = @conn.exec_params(number(sql), params)
      n = r.cmd_tuples
      r.clear
      n
    end

    def query(sql, params = [])
      r = @conn.exec_params(number(sql), params)
      rows = r.values
      r.clear
      rows
    end

    def transaction(&block) = @conn.transaction(&block)

    private

    def number(sql)
      (@numbered ||= {})[sql] ||= begin
        i = 0
        sql.gsub("?") { "$#{i += 1}" }
      end
    end
  end
end
