# frozen_string_literal: true

require "tmpdir"
require "rbconfig"
require "delegate"

# Databases, a stand-in `orders` table and relay processes for the outbox
# specs: real SQLite files and the PostgreSQL database `test`, tables named
# per example and dropped after it.
module OutboxSpecHelpers
  # What the guide calls `orders`: one table, one insert.
  class Orders
    def initialize(db, table)
      @db = db
      @table = table
      if mysql?
        @db.query("CREATE TABLE IF NOT EXISTS #{table} (id VARCHAR(64) PRIMARY KEY, total INTEGER NOT NULL)")
      elsif sqlite?
        @db.execute("CREATE TABLE IF NOT EXISTS #{table} (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
      else
        @db.exec("CREATE TABLE IF NOT EXISTS #{table} (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
      end
    end

    def insert(order)
      if mysql?
        @db.query("INSERT INTO #{@table} (id, total) VALUES ('#{@db.escape(order['id'])}', #{Integer(order['total'])})")
      elsif sqlite?
        @db.execute("INSERT INTO #{@table} (id, total) VALUES (?, ?)", [order["id"], order["total"]])
      else
        @db.exec_params("INSERT INTO #{@table} (id, total) VALUES ($1, $2)", [order["id"], order["total"]])
      end
    end

    def count
      return @db.query("SELECT COUNT(*) AS n FROM #{@table}").first["n"] if mysql?
      return @db.exec("SELECT COUNT(*) FROM #{@table}").getvalue(0, 0).to_i unless sqlite?

      row = @db.execute("SELECT COUNT(*) AS n FROM #{@table}").first
      row.is_a?(Hash) ? row["n"] : row.first
    end

    private

    def sqlite? = !@db.respond_to?(:exec_params)

    def mysql? = @db.respond_to?(:affected_rows)
  end

  # A Mysql2::Client with the transaction block the other drivers have, so
  # the shared examples read the same on every database.
  class MysqlDb < SimpleDelegator
    def transaction
      query("BEGIN")
      result = yield
      query("COMMIT")
      result
    rescue Exception # rubocop:disable Lint/RescueException
      query("ROLLBACK")
      raise
    end
  end

  def outbox_mysql
    MysqlDb.new(mysql_client)
  end

  def mysql_tables_to_drop
    @mysql_tables_to_drop ||= []
  end

  def drop_outbox_mysql_tables
    return if mysql_tables_to_drop.empty?

    c = mysql_client
    mysql_tables_to_drop.each { |t| c.query("DROP TABLE IF EXISTS #{t}") }
    c.close
  end

  def outbox_dir
    @outbox_dir ||= Dir.mktmpdir("acemq-outbox")
  end

  def outbox_sqlite_path
    File.join(outbox_dir, "#{unique('db')}.sqlite3")
  end

  def outbox_sqlite(path, results_as_hash: false)
    require "sqlite3"
    SQLite3::Database.new(path).tap do |db|
      db.busy_timeout = 10_000
      db.execute("PRAGMA journal_mode = WAL")
      db.results_as_hash = results_as_hash
    end
  end

  def outbox_pg
    require "pg"
    PG.connect(AceMQSpecHelpers::DATABASE_URL).tap { |c| c.set_notice_processor { |_| } }
  end

  def outbox_table(prefix = "outbox")
    "#{prefix}_#{SecureRandom.hex(5)}"
  end

  # Dropped after the example, whatever it left behind.
  def pg_tables_to_drop
    @pg_tables_to_drop ||= []
  end

  def drop_outbox_pg_tables
    return if pg_tables_to_drop.empty?

    conn = outbox_pg
    pg_tables_to_drop.each { |t| conn.exec("DROP TABLE IF EXISTS #{t}") }
    conn.close
  end

  # Bunny, for reading what was published the way any other client would.
  def outbox_bunny
    @outbox_bunny ||= begin
      require "bunny"
      Bunny.new(AceMQSpecHelpers::AMQP_URL, logger: Logger.new(nil)).tap(&:start)
    end
  end

  def outbox_bunny_channel
    @outbox_bunny_channel ||= outbox_bunny.create_channel
  end

  # Queues and exchanges this example declared; deleted after it.
  def broker_names
    @broker_names ||= { queues: [], exchanges: [] }
  end

  def cleanup_broker
    return unless @outbox_bunny

    AceMQSpecHelpers.delete_on(outbox_bunny, queues: broker_names[:queues], exchanges: broker_names[:exchanges])
  ensure
    @outbox_bunny&.close
    @outbox_bunny = nil
    @outbox_bunny_channel = nil
  end

  # An exchange bound to a queue: where the relay publishes in these specs.
  def destination(mq, exchange: unique("ox-x"), queue: unique("ox-q"), routing_key: "order.placed")
    AceMQ::AMQP::Topology.new.exchange(exchange, type: :direct).queue(queue).bind(queue, to: exchange, routing_key: routing_key).apply(mq)
    broker_names[:exchanges] << exchange
    broker_names[:queues].push(queue, "#{queue}.dlq")
    [exchange, queue]
  end

  # Everything in queue, read with Bunny (and acked), until it has been quiet
  # for `quiet` seconds or `timeout` passes.
  def drain(queue, expect: nil, timeout: 10, quiet: 0.3)
    got = []
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    last = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    loop do
      now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      delivery, props, body = outbox_bunny_channel.basic_get(queue, manual_ack: false)
      if delivery
        got << [props, body]
        last = now
        next
      end
      break if expect && got.size >= expect && now - last > quiet
      break if !expect && now - last > quiet
      break if now > deadline

      sleep 0.02
    end
    got
  end

  # A relay in its own Ruby process (spawned, not forked: the fault point
  # reads its variable once per process). Returns the pid.
  def spawn_relay(env: {}, **args)
    script = File.expand_path("outbox_relay_process.rb", __dir__)
    lib = File.expand_path("../../lib", __dir__)
    argv = args.flat_map { |k, v| ["--#{k}", v.to_s] }
    pid = Process.spawn(env, RbConfig.ruby, "-I", lib, script, *argv, out: File::NULL, err: $stderr)
    (@relay_pids ||= []) << pid
    pid
  end

  def wait_relay(pid, timeout: 30)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    loop do
      _, status = Process.wait2(pid, Process::WNOHANG)
      return status if status
      raise "relay process #{pid} still running after #{timeout}s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
    end
  end

  def reap_relays
    (@relay_pids || []).each do |pid|
      Process.kill(:KILL, pid)
      Process.wait(pid)
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    end
    @relay_pids = []
  end
end

RSpec.configure do |config|
  config.include OutboxSpecHelpers
  config.after do
    reap_relays
    drop_outbox_pg_tables
    drop_outbox_mysql_tables
    cleanup_broker
  end
end
