# frozen_string_literal: true

# Issue 4: consume + idempotency claim + confirm + ack, acemq against Bunny
# 2.19 doing the same INSERT (claim) and UPDATE (confirm) through the same
# Ruby driver, with the same prefetch, on the same broker and database, in
# the same run.
#
#   rake bench                     # builds the release extension, runs every bench
#   ruby bench/idempotency.rb      # this file alone (the extension must be built)
#
# AMQP_URL, BENCH_PG_URL (default postgres://postgres@127.0.0.1:5432/test),
# BENCH_MYSQL_URL (default mysql2://root@127.0.0.1:3306/test),
# BENCH_RUNS (default 3), BENCH_SCALE (default 1.0); BENCH_IDEMPOTENCY=targets
# stops after the issue-12 rows (against consume alone) and what bounds them;
# BENCH_IDEMPOTENCY=mysql runs consume alone and the MariaDB rows only.
#
# Backends: SQLite files (under tmp/, on the same disk as the checkout) in
# WAL mode with a 10 s busy timeout through the sqlite3 gem, once with
# SQLite's default synchronous=FULL (every commit fsyncs the WAL) and once
# with synchronous=NORMAL (what acemq's own path: store sets, and Rails 7.1);
# acemq's native path: store as an extra row; PostgreSQL through ruby-pg.
# Tables and files are named per run and dropped or removed at the end.
#
# Then where the time goes, each measured alone: the store's claim+confirm
# in a tight loop without a broker (acemq's store, and the baseline's two
# statements), the same two statements 100 keys per transaction (what a
# batch path would cost), and consume + parse + ack without a store.

require_relative "common"

module IdempotencyBench
  C = BenchCommon
  Ack = C::Ack
  Patterns = C::Patterns

  N = C.count(2_000)
  # The issue-12 rows (#targets) run as many messages as bench/run.rb's
  # consume row, against which they are read: at 2,000 a run lasted about
  # 80 ms, and the SQLite row moved from 0.72x to 0.94x between whole runs.
  N_TARGETS = C.count(10_000)
  BATCH = 100
  DAY_MS = 24 * 3600 * 1000

  class Runner
    include C::Cleanup

    def initialize
      setup_resources("idem")
      @split = []
      @worker = "bench@#{Process.pid}"
    end

    def sqlite(name, sync)
      db = C.sqlite(File.join(@dir, "#{name}.db"), sync)
      @closers << db
      db
    end

    def queue(name)
      q = "#{@prefix}-#{name}"
      AceMQ::AMQP::Topology.new.queue(q).apply(@mq)
      @queues << q << "#{q}.dlq"
      q
    end

    def preload(q, n)
      @admin.queue_purge(q)
      (0...n).each_slice(2_000) { |s| @mq.batch { |b| s.each { |i| b.publish(C::PAYLOADS[i % 64], to: q) } } }
    end

    # Both sides start each run from an empty table, so neither inserts into
    # a bigger B-tree than the other.
    def clear(raw, t) = raw.execute("DELETE FROM #{t}")

    # --- the two consumers -------------------------------------------------

    # acemq: Patterns.idempotent round a handler that parses and accepts.
    def acemq_run(q, store, clear_with, t, n, prefetch: C::PREFETCH, batch: 1)
      clear(clear_with, t)
      preload(q, n)
      latch = C::Latch.new(n)
      once = Patterns.idempotent(store) do |m|
        m.payload["order_id"]
        latch.hit
        Ack.accept
      end
      secs = C.time do
        sub = @mq.consume(q, prefetch: prefetch, batch: batch, &once)
        latch.wait(C::RUN_LIMIT)
        sub.cancel
      end
      s = once.stats
      raise "acemq idempotent: #{s.inspect}" unless s[:runs] == n && s[:confirmed] == n && s[:duplicates].zero?

      secs
    end

    # Bunny: the same claim (INSERT ... ON CONFLICT DO NOTHING, the store's
    # own statement) before the handler and the same confirm (UPDATE) after
    # it, through the same driver, then the ack.
    def bunny_run(q, raw, t, n)
      clear(raw, t)
      preload(q, n)
      claim = raw.claim_one(t)
      confirm = "UPDATE #{t} SET state = 'CONFIRMED' WHERE message_id = ?"
      latch = C::Latch.new(n)
      ran = 0
      secs = C.time do
        ch = @bunny.create_channel
        ch.prefetch(C::PREFETCH)
        consumer = ch.queue(q, passive: true).subscribe(manual_ack: true) do |di, props, body|
          key = props.headers["x-acemq-id"]
          ms = (Time.now.to_f * 1000).to_i
          if raw.execute(claim, [key, @worker, ms, ms + DAY_MS]) == 1
            JSON.parse(body)["order_id"]
            ran += 1
            raw.execute(confirm, [key])
          end
          ch.ack(di.delivery_tag)
          latch.hit
        end
        latch.wait(C::RUN_LIMIT)
        consumer.cancel
        ch.close
      end
      raise "bunny ran #{ran} of #{n}" unless ran == n

      secs
    end

    # --- the parts alone ----------------------------------------------------

    def store_alone(store, clear_with, t, n)
      clear(clear_with, t)
      keys = Array.new(n) { SecureRandom.uuid }
      C.time do
        keys.each do |k|
          raise "not first" unless store.first_time?(k)

          store.confirm(k)
        end
      end
    end

    def raw_alone(raw, t, n, per_transaction: 1)
      clear(raw, t)
      claim = raw.claim_one(t)
      confirm = "UPDATE #{t} SET state = 'CONFIRMED' WHERE message_id = ?"
      keys = Array.new(n) { SecureRandom.uuid }
      C.time do
        if per_transaction == 1
          keys.each do |k|
            ms = (Time.now.to_f * 1000).to_i
            raise "not first" unless raw.execute(claim, [k, @worker, ms, ms + DAY_MS]) == 1

            raw.execute(confirm, [k])
          end
        else
          # What a batch path would do: claim a prefetch's worth in one
          # transaction, run the handlers, confirm them in another.
          keys.each_slice(per_transaction) do |slice|
            raw.transaction do
              slice.each do |k|
                ms = (Time.now.to_f * 1000).to_i
                raise "not first" unless raw.execute(claim, [k, @worker, ms, ms + DAY_MS]) == 1
              end
            end
            raw.transaction { slice.each { |k| raw.execute(confirm, [k]) } }
          end
        end
      end
    end

    # consume(batch:) with a handler that answers call_many and does what
    # the guarded handler does minus the store: the batch path's own cost.
    def acemq_batched_alone(q, n, prefetch: C::PREFETCH)
      preload(q, n)
      latch = C::Latch.new(n)
      handler = lambda do |m|
        m.payload["order_id"]
        latch.hit
        Ack.accept
      end
      handler.define_singleton_method(:call_many) { |ms| ms.map { |m| handler.call(m) } }
      C.time do
        sub = @mq.consume(q, prefetch: prefetch, batch: C::PREFETCH, &handler)
        latch.wait(C::RUN_LIMIT)
        sub.cancel
      end
    end

    # The guard's batch calls over the store alone, no broker: claim 100
    # keys in one statement, confirm them in another.
    def store_batches(store, clear_with, t, n)
      clear(clear_with, t)
      guarded = Patterns.idempotent(store) { Ack.accept }
      batches = Array.new(n) { SecureRandom.uuid }.each_slice(BATCH).map do |keys|
        keys.map { |k| AceMQ::AMQP::Message.new(payload: { "order_id" => k }, envelope: AceMQ::AMQP::Envelope.new(id: k)) }
      end
      C.time do
        batches.each do |ms|
          raise "not all accepted" unless guarded.call_many(ms).all?(&:accept?)
        end
      end
    end

    # The store's two batch statements, built as the engine builds them,
    # straight through the database's own Ruby driver (ruby-pg, or the
    # sqlite3 gem on a WAL file with synchronous=NORMAL, as the `path:` store
    # opens it): what the database itself costs for a batch.
    def raw_batches(raw, t, n)
      clear(raw, t)
      claim = ->(k) do
        values = Array.new(k) { "(?, 'CLAIMED', ?, ?, ?)" }.join(", ")
        "INSERT INTO #{t} (message_id, state, claimed_by, recorded_at, expires_at) VALUES #{values} " \
          "ON CONFLICT (message_id) DO UPDATE SET claimed_by = excluded.claimed_by, recorded_at = excluded.recorded_at, " \
          "expires_at = excluded.expires_at WHERE #{t}.state = 'CLAIMED' AND #{t}.recorded_at < ? RETURNING message_id"
      end
      confirm = ->(k) { "UPDATE #{t} SET state = 'CONFIRMED' WHERE message_id IN (#{Array.new(k, '?').join(', ')})" }
      batches = Array.new(n) { SecureRandom.uuid }.each_slice(BATCH).to_a
      C.time do
        batches.each do |keys|
          ms = (Time.now.to_f * 1000).to_i
          params = keys.flat_map { |k| [k, @worker, ms, ms + DAY_MS] } << ms - 300_000
          claimed = raw.query(claim.(keys.size), params).size
          raise "claimed #{claimed} of #{keys.size}" unless claimed == keys.size

          raw.execute(confirm.(keys.size), keys)
        end
      end
    end

    # n autocommitted one-row INSERTs: what one commit costs on this database.
    def commits(conn, t, n)
      C.time { n.times { conn.exec_params("INSERT INTO #{t} VALUES ($1, 'X', 'w', 0, 0)", [SecureRandom.uuid]).clear } }
    end

    def acemq_consume_alone(q, n, prefetch: C::PREFETCH)
      preload(q, n)
      latch = C::Latch.new(n)
      C.time do
        sub = @mq.consume(q, prefetch: prefetch) do |m|
          m.payload["order_id"]
          latch.hit
          Ack.accept
        end
        latch.wait(C::RUN_LIMIT)
        sub.cancel
      end
    end

    def bunny_consume_alone(q, n)
      preload(q, n)
      latch = C::Latch.new(n)
      C.time do
        ch = @bunny.create_channel
        ch.prefetch(C::PREFETCH)
        consumer = ch.queue(q, passive: true).subscribe(manual_ack: true) do |di, _props, body|
          JSON.parse(body)["order_id"]
          ch.ack(di.delivery_tag)
          latch.hit
        end
        latch.wait(C::RUN_LIMIT)
        consumer.cancel
        ch.close
      end
    end

    # --- cases ----------------------------------------------------------------

    # One backend: acemq (and optionally acemq's native path: store) against
    # Bunny, alternated; then the store calls alone.
    def backend(label, key, ours_conn:, base_conn:, native_path: nil, target: nil)
      q = queue(key)
      t = "#{@table_prefix}_#{key}"
      @pg_tables << t if ours_conn.is_a?(PG::Connection)
      (@mysql_tables ||= []) << t if ours_conn.respond_to?(:affected_rows)
      ours = Patterns::SQLIdempotencyStore.new(connection: ours_conn, table: t, worker: @worker)
      ours.create_schema
      ours_raw = C::Raw.for(ours_conn)
      base_raw = C::Raw.for(base_conn)
      # The baseline gets its own connection (and, on SQLite, its own file),
      # with the same table made by the same DDL.
      Patterns::SQLIdempotencyStore.new(connection: base_conn, table: t, worker: @worker).create_schema
      sides = {
        acemq: -> { acemq_run(q, ours, ours_raw, t, N) },
        # consume(batch:): one claim and one confirm transaction per batch of
        # buffered deliveries, each message decided as it would be alone.
        batched: -> { acemq_run(q, ours, ours_raw, t, N, batch: C::PREFETCH) },
        bunny: -> { bunny_run(q, base_raw, t, N) }
      }
      if native_path
        nt = "#{t}_native"
        native = Patterns::SQLIdempotencyStore.new(path: native_path, table: nt, worker: @worker)
        native.create_schema
        native_raw = C::Raw.for(C.sqlite(native_path, "NORMAL").tap { |db| @closers << db })
        sides[:native] = -> { acemq_run(q, native, native_raw, nt, N, batch: C::PREFETCH) }
      end
      full = C.alternate(N, sides)
      row("#{label}", full[:acemq], full[:bunny], nil)
      row("#{label}, consume(batch: #{C::PREFETCH})", full[:batched], full[:bunny], target)
      row("#{label}, acemq `path:` store, consume(batch: #{C::PREFETCH})", full[:native], full[:bunny], target) if native_path

      alone = C.alternate(N, {
                            acemq: -> { store_alone(ours, ours_raw, t, N) },
                            raw: -> { raw_alone(base_raw, t, N) },
                            batch: -> { raw_alone(base_raw, t, N, per_transaction: BATCH) }
                          }.merge(native_path ? { native: -> { store_alone(native, native_raw, nt, N) } } : {}))
      @split << [label, "acemq", full[:acemq], alone[:acemq]]
      @split << ["#{label}", "acemq `path:`", full[:native], alone[:native]] if native_path
      @split << [label, "Bunny + driver", full[:bunny], alone[:raw]]
      @batch_rows ||= []
      @batch_rows << [label, alone[:raw], alone[:batch]]
      puts format("  %-58s store alone: acemq %6.0f/s%s, driver %6.0f/s, driver %d per txn %6.0f/s", label,
                  alone[:acemq], native_path ? format(", path: %6.0f/s", alone[:native]) : "", alone[:raw], BATCH,
                  alone[:batch])
    end

    def row(name, ours, base, target)
      ratio = ours / base
      result = target ? (ratio >= target ? "pass" : "MISS") : "(info)"
      @rows << [name, ours, base, ratio, target, result]
      puts format("  %-58s acemq %7.0f/s  Bunny %7.0f/s  %5.2fx", name, ours, base, ratio)
    end

    def consume_alone
      q = queue("plain")
      r = C.alternate(N, acemq: -> { acemq_consume_alone(q, N) }, bunny: -> { bunny_consume_alone(q, N) })
      @consume = r
      puts format("  %-58s acemq %7.0f/s  Bunny %7.0f/s  %5.2fx", "consume + parse + ack alone (no store)",
                  r[:acemq], r[:bunny], r[:acemq] / r[:bunny])
    end

    # The issue-12 rows: idempotent consume(batch: 100) against acemq's own
    # consume + parse + accept with no store, all three sides alternated run
    # by run in one set, so the ratios compare like with like.
    def targets
      plain = queue("target-plain")
      pq = queue("target-pg")
      sq = queue("target-path")
      t = "#{@table_prefix}_target"
      @pg_tables << t
      pg_conn = pg
      pg_store = Patterns::SQLIdempotencyStore.new(connection: pg_conn, table: t, worker: @worker)
      pg_store.create_schema
      pg_raw = C::Raw.for(pg_conn)
      path = File.join(@dir, "target.db")
      path_store = Patterns::SQLIdempotencyStore.new(path: path, table: t, worker: @worker)
      path_store.create_schema
      path_raw = C::Raw.for(C.sqlite(path, "NORMAL").tap { |db| @closers << db })
      r = C.alternate(N_TARGETS, {
                        alone: -> { acemq_consume_alone(plain, N_TARGETS) },
                        batched: -> { acemq_batched_alone(plain, N_TARGETS) },
                        pg: -> { acemq_run(pq, pg_store, pg_raw, t, N_TARGETS, batch: C::PREFETCH) },
                        path: -> { acemq_run(sq, path_store, path_raw, t, N_TARGETS, batch: C::PREFETCH) },
                        alone2: -> { acemq_consume_alone(plain, N_TARGETS, prefetch: 2 * C::PREFETCH) },
                        batched2: -> { acemq_batched_alone(plain, N_TARGETS, prefetch: 2 * C::PREFETCH) },
                        path2: -> { acemq_run(sq, path_store, path_raw, t, N_TARGETS, prefetch: 2 * C::PREFETCH, batch: C::PREFETCH) },
                        pg2: -> { acemq_run(pq, pg_store, pg_raw, t, N_TARGETS, prefetch: 2 * C::PREFETCH, batch: C::PREFETCH) },
                        pg_store: -> { store_batches(pg_store, pg_raw, t, N_TARGETS) },
                        path_store: -> { store_batches(path_store, path_raw, t, N_TARGETS) },
                        pg_raw: -> { raw_batches(pg_raw, t, N_TARGETS) },
                        path_raw: -> { raw_batches(path_raw, t, N_TARGETS) },
                        # n / 10 commits, scaled so its "rate" is commits per second.
                        pg_commit: -> { commits(pg_conn, t, N / 10) * 10 }
                      })
      puts format("  %-58s %7.0f/s", "consume + parse + accept alone (no store)", r[:alone])
      # What bounds the rows: the batch path with no store at all, and the
      # store's claim + confirm of 100 keys with no broker.
      puts format("  %-58s %7.0f/s  %5.2fx of consume alone", "consume(batch: #{C::PREFETCH}), no store (pass-through call_many)",
                  r[:batched], r[:batched] / r[:alone])
      puts format("  %-58s %7.0f/s  (%6.1f us/msg): the same two statements a batch, bare ruby-pg, no acemq",
                  "PostgreSQL, claim + confirm of 100 through ruby-pg alone", r[:pg_raw], us(r[:pg_raw]))
      puts format("  %-58s %7.0f/s  (%6.1f us/msg): the same two statements a batch, bare sqlite3 gem, no acemq",
                  "SQLite, claim + confirm of 100 through the sqlite3 gem alone", r[:path_raw], us(r[:path_raw]))
      puts format("  %-58s %7.2f ms: one autocommitted one-row INSERT here (its WAL flush); two a batch = %5.1f us/msg",
                  "PostgreSQL commit", us(r[:pg_commit]) / 1000, 2 * us(r[:pg_commit]) / BATCH)
      %i[pg path].each do |side|
        puts format("  %-58s %7.0f/s  %6.1f us/msg over the no-store batch path; store alone %6.1f us/msg",
                    "#{side == :pg ? 'PostgreSQL (ruby-pg)' : 'SQLite path:'} consume(batch: #{C::PREFETCH})",
                    r[side], us(r[side]) - us(r[:batched]), us(r[:"#{side}_store"]))
      end
      puts format("  %-58s %7.0f/s  %5.2fx of consume alone at prefetch 100", "consume alone (prefetch 200)", r[:alone2],
                  r[:alone2] / r[:alone])
      %i[batched2 path2 pg2].each do |k|
        puts format("  %-58s %7.0f/s  %5.2fx of consume alone at prefetch 200", "#{k} (prefetch 200)", r[k], r[k] / r[:alone2])
      end
      # The rows run batch 100 at the prefetch the library picks for it when
      # none is given (two batches per handler: 200), and consume alone at
      # the same prefetch. At prefetch 100 a batch of 100 is stop-and-wait
      # (the broker sends nothing more until the whole batch is acknowledged),
      # which the library never chooses; those figures are printed above.
      C::Table.ratio(path: "idempotent consume on PostgreSQL, consume(batch: 100), vs consume alone",
                     ours: r[:pg2], base: r[:alone2], target: 0.40, base_name: "consume alone, both at prefetch 200")
      C::Table.ratio(path: "idempotent consume, SQLite `path:` store, batch 100, vs consume alone",
                     ours: r[:path2], base: r[:alone2], target: 0.85, base_name: "consume alone, both at prefetch 200")
      @targets = r
    end

    def run
      started = C.now
      C.banner("AceMQ idempotency bench (#{N} messages per run, #{N_TARGETS} for the issue-12 rows; prefetch #{C::PREFETCH})")
      targets unless ENV["BENCH_IDEMPOTENCY"] == "mysql"
      return if ENV["BENCH_IDEMPOTENCY"] == "targets"

      consume_alone
      if ENV["BENCH_IDEMPOTENCY"] == "mysql"
        backend("MariaDB, mysql2", "mysql", ours_conn: mysql, base_conn: mysql)
        return tables
      end
      backend("SQLite, sqlite3 gem, WAL, synchronous=FULL (default)", "full",
              ours_conn: sqlite("full-acemq", "FULL"), base_conn: sqlite("full-bunny", "FULL"), target: 3.0)
      backend("SQLite, sqlite3 gem, WAL, synchronous=NORMAL", "normal",
              ours_conn: sqlite("normal-acemq", "NORMAL"), base_conn: sqlite("normal-bunny", "NORMAL"),
              native_path: File.join(@dir, "native.db"), target: 3.0)
      backend("PostgreSQL, ruby-pg", "pg", ours_conn: pg, base_conn: pg)
      # The baseline claims with one ON DUPLICATE KEY UPDATE; the store's
      # MySQL claim is that and a SELECT of what it wrote (see
      # core/src/idempotency/statements.rs): the row says what that costs.
      backend("MariaDB, mysql2", "mysql", ours_conn: mysql, base_conn: mysql)
      tables
      puts format("(%.0f s)", C.now - started)
    ensure
      cleanup
    end

    def us(rate) = rate ? 1e6 / rate : Float::NAN

    def tables
      puts
      puts "| backend | acemq msg/s | Bunny + same SQL msg/s | ratio | target | result |"
      puts "|---|---:|---:|---:|---:|---|"
      @rows.each do |name, ours, base, ratio, target, result|
        puts format("| %s | %.0f | %.0f | %.2fx | %s | %s |", name, ours, base, ratio,
                    target ? format(">= %.1fx", target) : "-", result)
      end
      puts
      puts "Where the time goes, microseconds per message (each part measured alone, medians):"
      puts
      puts "| backend | consumer | whole path | claim + confirm alone | consume + parse + ack alone | sum of the parts |"
      puts "|---|---|---:|---:|---:|---:|"
      @split.each do |label, side, full, store|
        consume = side.start_with?("acemq") ? @consume[:acemq] : @consume[:bunny]
        puts format("| %s | %s | %.0f | %.0f | %.0f | %.0f |", label, side, us(full), us(store), us(consume),
                    us(store) + us(consume))
      end
      puts
      puts "The baseline's two statements, one transaction each against #{BATCH} keys per transaction " \
           "(claim #{BATCH}, then confirm #{BATCH}):"
      puts
      puts "| backend | 1 per transaction, msg/s | #{BATCH} per transaction, msg/s | gain |"
      puts "|---|---:|---:|---:|"
      @batch_rows.each { |label, one, many| puts format("| %s | %.0f | %.0f | %.1fx |", label, one, many, many / one) }
    end

  end
end

IdempotencyBench::Runner.new.run
