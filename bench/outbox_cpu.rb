# frozen_string_literal: true

# What bounds the outbox's batch-1000 row on PostgreSQL (bench/outbox.rb):
# where each row's CPU goes, by process, beside the broker alone doing the
# same publishes. The relay runs through relay.start as in the row; 10,000
# rows a run, the two sides alternated, medians. For each side: wall time a
# row, and CPU a row of this Ruby process, the broker (every beam.smp), and
# PostgreSQL (every postgres process: the relay's backend, also shown alone,
# the bench's poll for an empty table, also alone, the WAL writer), with the
# machine's idle share over the run. Not part of
# `rake bench`: it explains a row of it.
#
#   ruby bench/outbox_cpu.rb    # the extension must be built (rake compile)
#
# AMQP_URL, BENCH_PG_URL, BENCH_RUNS (default 3), BENCH_SCALE (default 1).

require_relative "outbox"

module OutboxCPU
  C = BenchCommon
  # CPU microseconds so far by group, and the machine's idle and total
  # ticks. `backend` is the relay connection's PostgreSQL backend and
  # `poller` the bench's poll's, each also counted alone.
  def self.sample(backend, poller)
    cpu = Hash.new(0.0)
    Dir.glob("/proc/[0-9]*/stat").each do |f|
      comm, us = C.proc_cpu(f) || next
      group = if f == "/proc/#{Process.pid}/stat" then :ruby
              elsif comm == "beam.smp" then :broker
              elsif comm == "postgres" then :postgres
              end
      cpu[group] += us if group
      cpu[:backend] += us if f == "/proc/#{backend}/stat"
      cpu[:poller] += us if f == "/proc/#{poller}/stat"
    end
    all = File.read("/proc/stat")[/^cpu\s+(.*)$/, 1].split.map(&:to_i)
    [cpu, all[3] + all[4], all.sum]
  end

  class Runner < OutboxBench::Runner
    # The timed part of bench/outbox.rb's relay.start and broker-alone runs,
    # with the CPU each group spent in it, a row, kept for #run.
    include OutboxBench::Measured

    def sample = OutboxCPU.sample(@backend, @poller)

    def per_row((before, idle0, total0), (after, idle1, total1), secs, n)
      %i[ruby broker postgres backend poller].to_h { |g| [g, (after[g] - before[g]) / n] }
                                            .merge(wall: secs * 1e6 / n, idle: (idle1 - idle0).fdiv(total1 - total0))
    end

    def run
      C.banner("Outbox batch 1000 on PostgreSQL, CPU a row by process")
      n = C.count(10_000)
      t = "#{@table_prefix}_cpu"
      @pg_tables << t
      relay_conn = pg
      @backend = relay_conn.backend_pid
      store = C::Patterns::SQLOutboxStore.new(connection: relay_conn, table: t)
      store.create_schema
      raw = C::Raw.for(relay_conn)
      poll_conn = pg
      @poller = poll_conn.backend_pid
      poll = C::Raw.for(poll_conn)
      q = queue("cpu")
      runs = Hash.new { |h, k| h[k] = [] }
      C::RUNS.times do
        runs[:relay] << measured { acemq_started(store, raw, relay_conn, poll, q, n, 1000, t) }
        runs[:broker] << measured { broker_alone(q, n, 1000) }
      end
      med = runs.transform_values { |rs| rs.first.keys.to_h { |k| [k, C.median(rs.map { |r| r[k] })] } }
      %i[broker relay].each do |side|
        m = med[side]
        puts format("  %-26s %6.1f us/row wall (%6.0f rows/s); CPU a row: ruby %5.1f, broker %5.1f, postgres %5.1f us; " \
                    "machine idle %4.1f%%", side == :relay ? "relay.start, batch 1000" : "broker alone, batch 1000",
                    m[:wall], 1e6 / m[:wall], m[:ruby], m[:broker], m[:postgres], 100 * m[:idle])
      end
      r, b = med[:relay], med[:broker]
      puts format("  ratio %.2fx; the relay's extra a row: %.1f us wall; CPU: postgres %+.1f (the relay's own backend " \
                  "%+.1f, the bench's poll for an empty table %+.1f), ruby %+.1f, broker %+.1f us", b[:wall] / r[:wall],
                  r[:wall] - b[:wall], r[:postgres] - b[:postgres], r[:backend] - b[:backend], r[:poller] - b[:poller],
                  r[:ruby] - b[:ruby], r[:broker] - b[:broker])
    ensure
      cleanup
    end
  end
end

OutboxCPU::Runner.new.run
