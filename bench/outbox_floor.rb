# frozen_string_literal: true

# What bounds the outbox rows of bench/outbox.rb and bench/latency.rb: the
# cost of one commit on each database and of one persistent publish with its
# confirm on the broker, measured one at a time (200 each, median and p99),
# with nothing of acemq's in the way.
#
#   ruby bench/outbox_floor.rb
#
# AMQP_URL, BENCH_PG_URL.

require_relative "common"

module OutboxFloor
  C = BenchCommon
  N = 200

  def self.ms
    t = C.now
    yield
    (C.now - t) * 1000
  end

  def self.line(what, xs)
    s = xs.sort
    puts format("  %-66s median %6.2f ms  p99 %6.2f ms", what, s[s.size / 2], s[(s.size * 0.99).ceil - 1])
  end

  def self.run
    C.banner("Outbox floor: one commit, one confirm (#{N} each)")
    table = "bench_floor_#{Process.pid}"
    pg = PG.connect(C::PG_URL)
    pg.exec("CREATE TABLE #{table} (id int)")
    pg.exec("INSERT INTO #{table} VALUES (1)")
    line("PostgreSQL autocommitted UPDATE (synchronous_commit on)",
         Array.new(N) { ms { pg.exec("UPDATE #{table} SET id = id + 1") } })
    line("PostgreSQL autocommitted UPDATE, synchronous_commit off for it",
         Array.new(N) do
           ms { pg.exec("UPDATE #{table} SET id = id + 1 WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL") }
         end)
    dir = File.expand_path("../tmp/bench-floor-#{Process.pid}", __dir__)
    FileUtils.mkdir_p(dir)
    %w[FULL NORMAL].each do |sync|
      db = C.sqlite(File.join(dir, "#{sync}.db"), sync)
      db.execute("CREATE TABLE t (id int)")
      db.execute("INSERT INTO t VALUES (1)")
      line("SQLite WAL autocommitted UPDATE, synchronous=#{sync}", Array.new(N) { ms { db.execute("UPDATE t SET id = id + 1") } })
      db.close
    end
    bunny = Bunny.new(C::URL, logger: Logger.new(nil))
    bunny.start
    ch = bunny.create_channel
    ch.confirm_select
    q = ch.queue("acemq-bench-floor-#{Process.pid}", durable: true)
    body = JSON.generate(C::PAYLOADS[0])
    line("RabbitMQ persistent 1 KiB publish + its confirm (Bunny)",
         Array.new(N) { ms { ch.default_exchange.publish(body, routing_key: q.name, persistent: true) && ch.wait_for_confirms } })
  ensure
    q&.delete
    bunny&.close
    pg&.exec("DROP TABLE IF EXISTS #{table}")
    pg&.close
    FileUtils.rm_rf(dir) if dir
  end
end

OutboxFloor.run
