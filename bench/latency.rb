# frozen_string_literal: true

# Issue 12, item 5: the outbox's latency, commit to delivery, through
# `relay.start`: rows are added at 200/s, each in a transaction of its own,
# by a connection other than the relay's; each row's commit time (taken when
# COMMIT returns) is compared with the time a consumer on the destination
# queue receives it. p50 and p99 over every row.
#
#   ruby bench/latency.rb      # the extension must be built (rake compile)
#
# AMQP_URL, BENCH_PG_URL, BENCH_SCALE (rows: 1000 × scale per backend).
#
# PostgreSQL: the rows are added by a separate process (this file run with
# `adder`), so the wake-up measured is LISTEN/NOTIFY: the add's NOTIFY is
# delivered at commit to the relay's listening connection. SQLite: by a
# second connection (the sqlite3 gem, synchronous=NORMAL; BENCH_LATENCY_SYNC
# to change) on a thread of this process, the
# relay's store being path:, so the wake-up measured is the process-local
# one (an add from another process on SQLite waits for `interval`, the
# fallback poll; that case is printed too, for information). The relay
# keeps the default interval of 1 s throughout: what is measured is the
# wake-up, not a fast poll. The consumer is Bunny's (a subscription with
# automatic acks), which adds well under a millisecond.

require_relative "common"

module LatencyBench
  C = BenchCommon
  Patterns = C::Patterns
  RATE = 200.0
  N = C.count(1000)
  TARGET_P99_MS = 20.0

  # The separate process that adds rows on PostgreSQL: prints one JSON line
  # { message_id => commit time (Unix seconds, float) } when done.
  def self.adder(table, queue, n)
    mq = AceMQ::AMQP::Connection.open(C::URL, origin: "acemq-bench-adder")
    db = PG.connect(C::PG_URL)
    store = Patterns::SQLOutboxStore.new(connection: db, table: table)
    committed = pace(n) do |i|
      record = Patterns.record(mq, C::PAYLOADS[i % 64], to: queue)
      db.transaction { store.add(record, connection: db) }
      record.id
    end
    puts JSON.generate(committed)
  ensure
    db&.close
    mq&.close
  end

  # Calls the block n times at RATE per second (on a schedule, so a slow
  # add does not slow the rate down); { its result => Time.now after it }.
  def self.pace(n)
    start = C.now
    out = {}
    n.times do |i|
      wait = start + i / RATE - C.now
      sleep(wait) if wait.positive?
      id = yield i
      out[id] = Time.now.to_f
    end
    out
  end

  class Runner
    include C::Cleanup

    def initialize = setup_resources("latency")

    def queue(name)
      q = "#{@prefix}-#{name}"
      @admin.queue_declare(q, durable: true)
      @queues << q
      q
    end

    # A Bunny consumer noting when each message id arrives.
    def consume(q)
      got = {}
      lock = Mutex.new
      ch = @bunny.create_channel
      ch.prefetch(500)
      ch.queue(q, passive: true).subscribe(manual_ack: false) do |_info, props, _body|
        t = Time.now.to_f
        lock.synchronize { got[props.message_id] = t }
      end
      [got, lock, ch]
    end

    def measure(label, q, store, committed_by)
      got, lock, ch = consume(q)
      relay = Patterns::OutboxRelay.new(@mq, store, on_error: ->(e, **w) { warn("relay: #{e.class}: #{e.message} #{w}") })
      relay.start
      sleep 0.3 # the relay's first sweep (an empty table) and its LISTEN
      committed = committed_by.call
      deadline = C.now + 30
      sleep 0.05 until lock.synchronize { got.size } >= committed.size || C.now > deadline
      relay.close
      ch.close
      ms = committed.map { |id, t| lock.synchronize { got[id] } ? (got[id] - t) * 1000 : nil }
      missing = ms.count(&:nil?)
      raise "#{label}: #{missing} of #{committed.size} rows never arrived" if missing.positive?

      s = ms.sort
      p50 = s[(s.size * 0.50).floor]
      p99 = s[[(s.size * 0.99).ceil - 1, s.size - 1].min]
      puts format("  %-52s %5d rows  p50 %6.1f ms  p99 %6.1f ms  max %6.1f ms", label, s.size, p50, p99, s.last)
      [p50, p99]
    end

    def postgres
      t = "#{@table_prefix}_pg"
      @pg_tables << t
      q = queue("pg")
      store = Patterns::SQLOutboxStore.new(connection: pg, table: t)
      store.create_schema
      p50, p99 = measure("PostgreSQL, adds from another process", q, store, lambda {
        out = IO.popen([RbConfig.ruby, __FILE__, "adder", t, q, N.to_s], &:read)
        raise "adder failed: #{out}" unless $?.success?

        JSON.parse(out.lines.last)
      })
      row("PostgreSQL", p50, p99)
    end

    def sqlite
      path = File.join(@dir, "latency.db")
      store = Patterns::SQLOutboxStore.new(path: path)
      store.create_schema
      # NORMAL, the setting WAL is meant for (durable across a crash of the
      # process, not of the machine): with FULL, the adder's own fsync per
      # commit holds SQLite's one write lock most of the time at 200
      # commits/s here, and the relay's claim queues behind it (README).
      app = C.sqlite(path, ENV.fetch("BENCH_LATENCY_SYNC", "NORMAL"))
      @closers << app
      adding = Patterns::SQLOutboxStore.new(connection: app)
      q = queue("sqlite")
      p50, p99 = measure("SQLite, adds from another connection here", q, store, lambda {
        LatencyBench.pace(N) do |i|
          record = Patterns.record(@mq, C::PAYLOADS[i % 64], to: q)
          app.transaction { adding.add(record, connection: app) }
          record.id
        end
      })
      row("SQLite", p50, p99)
    end

    def row(backend, p50, p99)
      C::Table.row(path: "outbox latency, commit to delivery, 200 rows/s through `relay.start` (#{backend})",
                   result: format("p50 %.1f ms, p99 %.1f ms", p50, p99), target: "p99 <= 20 ms",
                   pass: p99 <= TARGET_P99_MS)
    end

    def run
      started = C.now
      C.banner("AceMQ outbox latency bench (#{N} rows per backend at #{RATE.round}/s, interval 1 s)")
      postgres
      sqlite
      puts format("(%.0f s)", C.now - started)
    ensure
      cleanup
    end
  end
end

if ARGV[0] == "adder"
  LatencyBench.adder(ARGV[1], ARGV[2], Integer(ARGV[3]))
else
  LatencyBench::Runner.new.run
end
