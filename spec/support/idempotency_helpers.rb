# frozen_string_literal: true

require "tmpdir"
require "timeout"

# Databases and processes for the idempotency specs: real SQLite files and
# the PostgreSQL database `test`, a table per example, and forked children
# that are always reaped.
module IdempotencySpecHelpers
  def sqlite_path
    @sqlite_dir ||= Dir.mktmpdir("acemq-idem")
    File.join(@sqlite_dir, "#{unique('db')}.sqlite3")
  end

  # A SQLite3::Database as an application would open it for several
  # processes: WAL, and a busy timeout so a writer waits rather than fails.
  def sqlite_db(path, results_as_hash: false)
    require "sqlite3"
    db = SQLite3::Database.new(path)
    db.busy_timeout = 10_000
    db.execute("PRAGMA journal_mode = WAL")
    db.results_as_hash = results_as_hash
    db
  end

  def pg_connection
    require "pg"
    PG.connect(AceMQSpecHelpers::DATABASE_URL).tap { |c| c.set_notice_processor { |_| } }
  end

  # A Mysql2::Client on MYSQL_URL, as an application opens one.
  def mysql_client(encoding: "utf8mb4")
    require "mysql2"
    require "uri"
    u = URI(AceMQSpecHelpers::MYSQL_URL)
    Mysql2::Client.new(host: u.host, port: u.port || 3306, username: u.user, password: u.password,
                       database: u.path.delete_prefix("/"), encoding: encoding)
  end

  def drop_mysql_tables(*tables)
    c = mysql_client
    tables.each { |t| c.query("DROP TABLE IF EXISTS #{t}") }
  ensure
    c&.close
  end

  def unique_table(prefix = "idem")
    "#{prefix}_#{SecureRandom.hex(5)}"
  end

  def drop_pg_tables(*tables)
    conn = pg_connection
    tables.each { |t| conn.exec("DROP TABLE IF EXISTS #{t}") }
  ensure
    conn&.close
  end

  # Fork a child running the block; its stdout is a pipe the parent reads
  # lines from. Killed (SIGKILL) and reaped after the example.
  def spawn_child(&block)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      writer.sync = true
      $stdout.reopen(writer)
      begin
        block.call(writer)
      rescue Exception => e # rubocop:disable Lint/RescueException
        warn("child #{Process.pid}: #{e.class}: #{e.message}\n#{e.backtrace.first(5).join("\n")}")
        exit!(1)
      end
      exit!(0)
    end
    writer.close
    (@children ||= []) << pid
    [pid, reader]
  end

  # Two child processes, each with the store the block builds, call
  # first_time? on the same `rounds` keys, released together; how many won
  # each key. Each stays alive until both are done: a claim whose process
  # has exited is taken over at once (docs/ordering.md), so a child that
  # finished first and left would hand its unconfirmed claims to the other.
  def race_first_time(rounds, &build_store)
    go_r, go_w = IO.pipe
    done_r, done_w = IO.pipe
    children = Array.new(2) do
      spawn_child do |out|
        go_w.close
        done_w.close
        s = build_store.call
        go_r.read # both start when the parent closes the pipe
        rounds.times { |i| out.puts("#{i} #{s.first_time?("race-#{i}")}") }
        out.puts("end")
        out.flush
        done_r.read # alive, holding its claims, until the parent has both
      end
    end
    go_r.close
    go_w.close
    done_r.close
    wins = Hash.new(0)
    children.each do |_, io|
      Timeout.timeout(30) do
        io.each_line do |l|
          break if l.chomp == "end"

          i, won = l.split
          wins[i.to_i] += 1 if won == "true"
        end
      end
    end
    done_w.close
    children.each { |pid, _| expect(wait_child(pid)).to be_success }
    wins
  end

  def read_line(io, timeout: 10)
    Timeout.timeout(timeout) { io.gets&.chomp }
  end

  def wait_child(pid, timeout: 20)
    Timeout.timeout(timeout) { Process.wait2(pid).last }
  end

  def reap_children
    (@children || []).each do |pid|
      Process.kill(:KILL, pid)
    rescue Errno::ESRCH
      nil
    ensure
      begin
        Process.wait(pid)
      rescue Errno::ECHILD
        nil
      end
    end
    @children = []
  end
end

RSpec.configure do |config|
  config.include IdempotencySpecHelpers
  config.after { reap_children }
end
