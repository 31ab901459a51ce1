# frozen_string_literal: true

# What bounds the outbox's batch-1000 row on SQLite (bench/outbox.rb): the
# database's own work a row beside what the 0.90x target leaves it. Three
# sides, alternated, 10,000 rows of the bench's payload each, medians:
#
# - the relay as in the row: relay.start, batch 1000, its store on a
#   sqlite3 gem connection (WAL, synchronous=FULL);
# - the broker alone: the same messages published by acemq, 1000 at a time;
# - SQLite alone: the relay's two statements a batch, the claim
#   (UPDATE ... RETURNING of 1000 rows, as core/src/outbox/statements.rs
#   builds it) and the delete of those rows, through the same kind of
#   sqlite3 gem connection, with nothing of acemq's and no broker.
#
# For each: wall time and this process's CPU a row (SQLite runs inside it).
# Not part of `rake bench`: it explains a row of it.
#
#   ruby bench/outbox_sqlite_cpu.rb    # the extension must be built (rake compile)
#
# AMQP_URL, BENCH_RUNS (default 3), BENCH_SCALE (default 1).

require_relative "outbox"

module OutboxSQLiteCPU
  C = BenchCommon
  BATCH = 1000
  NOW = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"

  class Runner < OutboxBench::Runner
    include OutboxBench::Measured

    def sample = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)

    def per_row(before, after, secs, n) = { wall: secs * 1e6 / n, cpu: (after - before) * 1e6 / n }

    # The claim and the delete the started relay runs for each batch, on
    # the rows store.add wrote, until the table is empty.
    def sqlite_alone(store, raw, adding, q, n, t)
      preload(store, raw, adding, q, n)
      due = "next_attempt_at <= #{NOW} AND (claimed_until IS NULL OR claimed_until < #{NOW})"
      claim = "UPDATE #{t} SET claimed_by = ?1, claimed_until = #{NOW} + ?2 WHERE id IN " \
              "(SELECT id FROM #{t} WHERE #{due} ORDER BY id LIMIT ?3) RETURNING id, exchange, routing_key, body, " \
              "message_id, message_type, origin, \"timestamp\", headers, attempts"
      timed(n) do
        loop do
          rows = @db.execute(claim, ["bench", 30_000, BATCH])
          break if rows.empty?

          ids = rows.map(&:first)
          @db.execute("DELETE FROM #{t} WHERE claimed_by = ? AND id IN (#{Array.new(ids.size, '?').join(', ')})",
                      ["bench", *ids])
        end
      end
      raise "SQLite alone: rows left" unless store.backlog.count.zero?
    end

    def run
      C.banner("Outbox batch 1000 on SQLite, the database's own work a row")
      n = C.count(10_000)
      t = "#{@table_prefix}_sqlite_cpu"
      relay_conn = sqlite
      @db = sqlite
      store = C::Patterns::SQLOutboxStore.new(connection: relay_conn, table: t)
      store.create_schema
      raw = C::Raw.for(relay_conn)
      poll = C::Raw.for(sqlite)
      q = queue("sqlite-cpu")
      runs = Hash.new { |h, k| h[k] = [] }
      C::RUNS.times do
        runs[:relay] << measured { acemq_started(store, raw, relay_conn, poll, q, n, BATCH, t) }
        runs[:broker] << measured { broker_alone(q, n, BATCH) }
        runs[:sqlite] << measured { sqlite_alone(store, raw, relay_conn, q, n, t) }
      end
      med = runs.transform_values { |rs| %i[wall cpu].to_h { |k| [k, C.median(rs.map { |r| r[k] })] } }
      { relay: "relay.start, batch 1000", broker: "broker alone, batch 1000",
        sqlite: "SQLite alone: claim + delete" }.each do |side, label|
        puts format("  %-30s %6.1f us/row wall (%6.0f rows/s), %5.1f us/row of this process's CPU", label,
                    med[side][:wall], 1e6 / med[side][:wall], med[side][:cpu])
      end
      b = med[:broker][:wall]
      puts format("  ratio %.2fx; at 0.90x the relay may add %.1f us a row to the broker's %.1f; it added %.1f; " \
                  "SQLite alone took %.1f us a row of wall time, %.1f of CPU, on the cores the broker uses",
                  b / med[:relay][:wall], b / 0.9 - b, b, med[:relay][:wall] - b, med[:sqlite][:wall], med[:sqlite][:cpu])
    ensure
      cleanup
    end
  end
end

OutboxSQLiteCPU::Runner.new.run
