# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "fileutils"
require "pg"
require "socket"
require "sqlite3"
require "tmpdir"

# The database goes away under a guarded consumer on the real broker (issue
# 30 part 3): a private PostgreSQL stopped and started, a SQLite file locked
# by another process, a SQLite file on a full filesystem. Each time the
# valid messages wait round the ladder (no attempt spent) and are handled
# once when the database is back; none is dead-lettered, although the
# ladder has two attempts, which a retry per failure would use up at once.
# The recovery times are printed, never asserted.
RSpec.describe "A database outage under a guarded consumer" do
  Patterns = AceMQ::AMQP::Patterns unless defined?(Patterns)
  MESSAGES = 20
  RETRIES = { max_attempts: 2, initial_delay: 0.05, max_delay: 0.2 }.freeze

  let(:queue) { unique("db-outage") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:handled) { Queue.new }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }

  after do
    @sub&.cancel
    mq.close
  end

  def publish_all
    Array.new(MESSAGES) { |i| "O-#{i}".tap { |o| mq.publish({ "order_id" => o }, to: queue) } }
  end

  def consume(store)
    @sub = mq.consume(queue, retries: RETRIES, &Patterns.idempotent(store) do |m|
      handled << m.payload["order_id"]
      AceMQ::AMQP::Ack.accept
    end)
  end

  def all_handled_once(orders, back_at, what)
    eventually(timeout: 30) { @sub.stats[:accepted] >= orders.size && handled.size >= orders.size }
    puts format("    %s: back to all %d handled %.2fs", what, orders.size, Process.clock_gettime(Process::CLOCK_MONOTONIC) - back_at)
    got = Array.new(handled.size) { handled.pop }
    expect(got.tally.select { |_, n| n > 1 }).to be_empty
    expect(got.sort).to eq(orders.sort)
    expect(@sub.stats[:dead_lettered]).to eq(0)
    expect(mq.peek_dead_letters(queue, limit: 3)).to be_empty
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  it "PostgreSQL stopped (immediate) and started: the guard's store fails, the messages wait, " \
     "SQL.per_thread opens new connections" do
    port = TCPServer.new("127.0.0.1", 0).then { |s| s.addr[1].tap { s.close } }
    dir = File.join(Dir.tmpdir, "acemq-spec-pg-#{Process.pid}")
    pg_ctl = lambda do |*args|
      bin = Dir["/usr/lib/postgresql/*/bin"].max_by { |d| d[%r{postgresql/(\d+)}, 1].to_i }
      system("runuser", "-u", "postgres", "--", "#{bin}/pg_ctl", "-D", "#{dir}/data", *args, out: File::NULL) or
        raise "pg_ctl #{args.last} failed"
    end
    system(File.expand_path("../../.ci/postgres", __dir__), "start", port.to_s, dir, out: File::NULL) or
      skip "cannot start a private PostgreSQL (.ci/postgres needs root and PostgreSQL's binaries)"
    begin
      url = "postgres://postgres@127.0.0.1:#{port}/test"
      store = Patterns::SQLIdempotencyStore.new(connection: AceMQ::AMQP::SQL.per_thread { PG.connect(url) },
                                                table: "outage_idem", claim_timeout: 1)
      store.create_schema
      consume(store)
      pg_ctl.call("-m", "immediate", "-w", "stop")
      orders = publish_all
      eventually(timeout: 10) { @sub.stats[:waited] >= MESSAGES }
      pg_ctl.call("-l", "#{dir}/server.log", "-w", "-o", "-p #{port} -k #{dir} -c listen_addresses=127.0.0.1", "start")
      all_handled_once(orders, now, "PostgreSQL")
    ensure
      system(File.expand_path("../../.ci/postgres", __dir__), "stop", dir, out: File::NULL)
      FileUtils.rm_rf(dir)
    end
  end

  it "a handler that finds the database away (PG::ConnectionBad, wrapped) waits rather than spending an attempt" do
    error = begin
      begin
        raise PG::ConnectionBad, "connection to server failed"
      rescue PG::ConnectionBad
        raise AceMQ::AMQP::StoreError, "cannot confirm"
      end
    rescue AceMQ::AMQP::StoreError => e
      e
    end
    expect(AceMQ::AMQP::SQL.unavailable?(error)).to be(true)
    expect(AceMQ::AMQP::SQL.unavailable?(PG::UniqueViolation.new("duplicate key"))).to be(false)

    failures = 3
    @sub = mq.consume(queue, retries: RETRIES) do |m|
      if (failures -= 1) >= 0
        raise error
      else
        handled << m.payload["order_id"]
        AceMQ::AMQP::Ack.accept
      end
    end
    mq.publish({ "order_id" => "H-1" }, to: queue)
    all_handled_once(["H-1"], now, "handler")
    expect(@sub.stats[:waited]).to eq(3)
  end

  it "SQLite locked by another process: the store's busy statements wait, nothing is dead-lettered" do
    Dir.mktmpdir do |dir|
      path = File.join(dir, "keys.db")
      store = Patterns::SQLIdempotencyStore.new(
        connection: AceMQ::AMQP::SQL.per_thread { SQLite3::Database.new(path).tap { |d| d.busy_timeout = 100 } },
        claim_timeout: 1
      )
      store.create_schema
      r, w = IO.pipe
      holder = fork do
        r.close
        db = SQLite3::Database.new(path)
        db.execute("BEGIN EXCLUSIVE")
        w.puts "locked"
        w.close
        sleep 3
        db.execute("COMMIT")
        exit!(0)
      end
      w.close
      expect(r.gets).to eq("locked\n")
      consume(store)
      orders = publish_all
      eventually(timeout: 10) { @sub.stats[:waited] >= 1 }
      Process.wait(holder)
      all_handled_once(orders, now, "SQLite lock")
      expect(@sub.stats[:waited]).to be >= 1
    end
  end

  it "SQLite on a full filesystem (a 512 KiB tmpfs): SQLITE_FULL waits until space is freed" do
    skip "mounting a tmpfs needs root" unless Process.uid.zero?
    Dir.mktmpdir do |dir|
      system("mount", "-t", "tmpfs", "-o", "size=512k", "acemq-spec", dir) or skip "mount -t tmpfs failed"
      begin
        path = File.join(dir, "keys.db")
        store = Patterns::SQLIdempotencyStore.new(path: path, claim_timeout: 1)
        store.create_schema
        filler = File.join(dir, "filler")
        File.open(filler, "wb") do |f|
          # Unbuffered: nothing is left to flush (and fail) at close.
          loop { f.syswrite("\0" * 4096) }
        rescue Errno::ENOSPC
          nil
        end
        consume(store)
        orders = publish_all
        eventually(timeout: 10) { @sub.stats[:waited] >= 1 }
        File.delete(filler)
        all_handled_once(orders, now, "SQLite full")
      ensure
        @sub&.cancel
        @sub = nil
        store&.close if store.respond_to?(:close)
        system("umount", "-l", dir)
      end
    end
  end
end
