# frozen_string_literal: true

# Issue 48: the dead-letter store's reads on 100,000 rows, on SQLite,
# PostgreSQL and MariaDB: the first page, filters that match 3 rows (the
# deepest a filter gets: nothing stops it early), and the grouped counts.
# The target is 100 ms for each (issue 48, part 2). Not a test: it prints.
#
#   ruby bench/dead_letters.rb     # the extension must be built (rake compile)
#
# BENCH_PG_URL, BENCH_MYSQL_URL as bench/common.rb; BENCH_RUNS (default 7):
# each read is timed that many times and the median printed;
# BENCH_DL_ROWS (default 100000).
#
# The rows are written with the databases' own bulk inserts (not timed),
# in the store's own table (create_schema): 5 queues, 20 reasons, 8 error
# classes, 6 types, failed_at over 30 days, a 200-byte body and a
# 300-byte headers document each, and 3 rows with a reason, an error class
# and a message id nothing else has. The store is read the way an
# application reads it: SQLite through a file the library opens (path:),
# PostgreSQL through a PG::Connection and MariaDB through a Mysql2::Client
# (connection:).

require_relative "common"
require "acemq/amqp/sql_dead_letter_store"

module DeadLettersBench
  C = BenchCommon
  Store = AceMQ::AMQP::SQLDeadLetterStore
  ROWS = Integer(ENV.fetch("BENCH_DL_ROWS", "100000"))
  RUNS = Integer(ENV.fetch("BENCH_RUNS", "7"))
  QUEUES = 5.times.map { "bench.queue.#{_1}" }
  REASONS = 20.times.map { "handler raised: card declined by issuer, code #{_1}" }
  CLASSES = 8.times.map { "Payments::Error#{_1}" }
  TYPES = 6.times.map { "payment.requested.v#{_1}" }
  NOW = 1_765_000_000
  RARE = [ROWS / 4, ROWS / 2, (ROWS * 3) / 4].freeze

  COLUMNS = %w[queue message_id content_hash body body_encoding headers properties message_type reason error_class
               attempt exchange routing_key failed_at ingested_at history backtrace].freeze

  def self.row(n)
    rare = RARE.include?(n)
    headers = { "x-acemq-reason" => REASONS[n % 20], "x-acemq-attempt" => 3, "x-acemq-id" => "m-#{n}",
                "x-acemq-history" => [{ "reason" => "timeout", "attempts" => 3 }], "trace" => "x" * 120 }
    [QUEUES[n % 5], rare ? "needle-#{n}" : "m-#{n}", format("%032x", n), %({"order_id":"#{n}","amount":4200,"note":"#{'y' * 150}"}),
     "utf8", JSON.generate(headers), %({"content_type":"application/json","type":"#{TYPES[n % 6]}"}), TYPES[n % 6],
     rare ? "needle in the haystack #{n}" : REASONS[n % 20], rare ? "Rare::Error" : CLASSES[n % 8], 3, "payments",
     "payment.requested", NOW - (n * 26) % (30 * 86_400), NOW, "[]", "app/x.rb:1\napp/y.rb:2"]
  end

  def self.fill(kind, db, table)
    ROWS.times.each_slice(1000) do |slice|
      rows = slice.map { row(_1) }
      case kind
      when :sqlite
        db.transaction do
          sql = "INSERT INTO #{table} (#{COLUMNS.join(', ')}) VALUES (#{(['?'] * COLUMNS.size).join(', ')})"
          st = db.prepare(sql)
          rows.each { st.execute(_1) }
          st.close
        end
      when :pg
        values = rows.map { |r| "(#{r.map { |v| db.escape_literal(v.to_s) }.join(', ')})" }
        db.exec("INSERT INTO #{table} (#{COLUMNS.join(', ')}) VALUES #{values.join(', ')}")
      when :mysql
        values = rows.map { |r| "(#{r.map { |v| "'#{db.escape(v.to_s)}'" }.join(', ')})" }
        db.query("INSERT INTO #{table} (#{COLUMNS.join(', ')}) VALUES #{values.join(', ')}")
      end
    end
    # What autovacuum does to a table this size soon after it is filled:
    # it marks the pages all-visible, which index-only scans need.
    db.exec("VACUUM ANALYZE #{table}") if kind == :pg
    db.query("ANALYZE TABLE #{table}").to_a if kind == :mysql
    db.execute("ANALYZE") if kind == :sqlite
  end

  def self.median_ms
    times = RUNS.times.map do
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      yield
      (Process.clock_gettime(Process::CLOCK_MONOTONIC) - t) * 1000
    end
    times.sort[times.size / 2]
  end

  def self.reads(store)
    {
      "first page (50, no filter)" => [-> { store.list(limit: 50) }, 50],
      "first page of a queue" => [-> { store.list(queue: QUEUES[2], limit: 50) }, 50],
      "error_class, 3 match" => [-> { store.list(error_class: "Rare::Error") }, 3],
      "reason contains, 3 match" => [-> { store.list(reason: "haystack") }, 3],
      "message id, 1 match" => [-> { store.list(id: "needle-#{RARE[1]}") }, 1],
      "type + queue, page" => [-> { store.list(type: TYPES[1], queue: QUEUES[1], limit: 50) }, 50],
      "failed_at range, page" => [-> { store.list(since: Time.at(NOW - 86_400), before: Time.at(NOW), limit: 50) }, 50],
      "counts (all rows)" => [-> { store.counts }, nil],
      "counts of a queue" => [-> { store.counts(queue: QUEUES[3]) }, nil],
      "counts, reason contains" => [-> { store.counts(reason: "code 1") }, nil]
    }
  end

  def self.run
    dir = File.expand_path("../tmp/bench-dead-letters", __dir__)
    FileUtils.rm_rf(dir)
    FileUtils.mkdir_p(dir)
    table = "bench_dl_#{SecureRandom.hex(4)}"
    results = {}
    %i[sqlite pg mysql].each do |kind|
      path = File.join(dir, "dl.db")
      db = case kind
           when :sqlite then SQLite3::Database.new(path).tap { _1.execute("PRAGMA journal_mode = WAL") }
           when :pg then PG.connect(C::PG_URL).tap { _1.exec("SET client_min_messages = warning") }
           when :mysql then C.mysql_client
           end
      names = { table: table, audit_table: "#{table}_audit" }
      store = kind == :sqlite ? Store.new(path: path, **names) : Store.new(connection: db, **names)
      store.create_schema
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      fill(kind, db, table)
      filled = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
      total = store.counts[:total]
      raise "#{kind}: #{total} rows, not #{ROWS}" unless total == ROWS

      results[kind] = reads(store).to_h do |name, (read, want)|
        got = read.call
        n = got.is_a?(Store::Page) ? got.letters.size : got[:total]
        raise "#{kind} #{name}: #{n} rows, not #{want}" if want && n != want

        [name, median_ms { read.call }]
      end
      warn format("%-7s filled %d rows in %.1fs", kind, ROWS, filled)
    ensure
      case kind
      when :pg then db&.exec("DROP TABLE IF EXISTS #{table}; DROP TABLE IF EXISTS #{table}_audit")
      when :mysql then [table, "#{table}_audit"].each { db&.query("DROP TABLE IF EXISTS #{_1}") }
      end
      db&.close
    end
    print_table(results)
  ensure
    FileUtils.rm_rf(dir) if dir
  end

  def self.print_table(results)
    puts format("%-28s %10s %10s %10s   (median of %d, ms; target 100)", "#{ROWS} rows", "SQLite", "PostgreSQL", "MariaDB", RUNS)
    results.values.first.each_key do |name|
      puts format("%-28s %10.1f %10.1f %10.1f", name, *%i[sqlite pg mysql].map { results[_1][name] })
    end
  end
end

DeadLettersBench.run if $PROGRAM_NAME == __FILE__
