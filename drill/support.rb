# frozen_string_literal: true

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "acemq"
require "bunny"
require "json"
require "logger"
require "pg"
require "rbconfig"
require "securerandom"
require "uri"
require_relative "../spec/support/runner_helpers"
require_relative "sql_connect"
require_relative "wait"

# What the drill's phases share: bounded polling, child processes reaped by
# pid, PostgreSQL tables named per run, a publisher that survives a broker
# going away, and Bunny for reading queues as any other client would.
module Drill
  ROOT = RunnerHelpers::ROOT
  DATABASE_URL = ENV.fetch("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")

  def self.say(line) = $stdout.puts(line)

  # Every child the drill starts, so cleanup can kill exactly those.
  module Children
    @pids = []
    @lock = Mutex.new

    def self.add(pid) = @lock.synchronize { @pids << pid }
    def self.forget(pid) = @lock.synchronize { @pids.delete(pid) }

    def self.reap_all
      @lock.synchronize { @pids.dup }.each do |pid|
        Process.kill("KILL", pid)
        Process.wait(pid)
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      ensure
        forget(pid)
      end
    end
  end

  # An `acemq run` process (RunnerHelpers::RunnerProcess: its output, its
  # handler log, its health endpoint, wait with a limit).
  class Runner
    attr_reader :process, :started_at
    attr_accessor :killed_at

    def self.spawn(env, app: File.join(__dir__, "charge_app.rb"))
      dir = Dir.mktmpdir("acemq-drill-runner")
      output = File.join(dir, "runner.out")
      log = File.join(dir, "handled.log")
      pid = Process.spawn({ "LOG" => log }.merge(env), RbConfig.ruby, "-I", File.join(ROOT, "lib"), RunnerHelpers::EXE,
                          "run", "-r", app, out: output, err: %i[child out])
      Children.add(pid)
      new(RunnerHelpers::RunnerProcess.new(pid: pid, log: log, output: output), dir, env["ORIGIN"])
    end

    attr_reader :origin

    def initialize(process, dir, origin)
      @process = process
      @origin = origin
      @dir = dir
      @started_at = Drill.now
      @status = nil
    end

    def pid = @process.pid
    def text = @process.text
    def handled = @process.handled

    def running?
      text.include?("acemq: running")
    end

    # Wait until it logs that it runs; fail with its output if it died first.
    def await_running(limit = 30)
      Drill.eventually(limit, "runner #{pid} to boot") do
        running? || (exited? && raise(Failure, "runner #{pid} died while booting:\n#{text}"))
      end
      self
    end

    # The exit status once it has exited (nil while it runs).
    def exited?
      @status ||= @process.wait(0)
    end

    def kill9
      @killed_at = Drill.now
      @process.signal("KILL")
      @status = @process.wait(10) or raise Failure, "runner #{pid} survived kill -9"
      Children.forget(pid)
      @status
    end

    # TERM and wait for the drain: the status (0 is a clean stop).
    def stop(limit = 15)
      @process.signal("TERM")
      @status = @process.wait(limit)
      unless @status
        kill9
        raise Failure, "runner #{pid} did not stop within #{limit}s of TERM:\n#{text.lines.last(20).join}"
      end
      Children.forget(pid)
      @status
    end

    def health(path) = @process.health(path)

    def cleanup = FileUtils.rm_rf(@dir)
  end

  # PostgreSQL through the pg gem: the drill's own tables, dropped at the end.
  class Database
    # url: the shared server, or the database phase's own.
    def initialize(url = DATABASE_URL)
      @conn = PG.connect(url)
      @conn.set_notice_processor { |_| }
      @tables = []
    end

    attr_reader :conn

    def exec(sql, params = []) = @conn.exec_params(sql, params)
    def value(sql, params = []) = exec(sql, params).getvalue(0, 0)

    # A charges table (with when, by which runner, on the database's clock)
    # and the idempotency table of the guide's migration, for one phase.
    def charge_tables(prefix)
      charges = "#{prefix}_charges"
      keys = "#{prefix}_idem"
      exec("CREATE TABLE #{charges} (id bigserial PRIMARY KEY, order_id varchar(64) NOT NULL, pid integer, " \
           "charged_at timestamptz NOT NULL DEFAULT clock_timestamp())")
      exec("CREATE TABLE #{keys} (message_id varchar(255) PRIMARY KEY, state varchar(16) NOT NULL, " \
           "claimed_by varchar(64), recorded_at timestamp NOT NULL, expires_at timestamp NOT NULL)")
      @tables.push(charges, keys)
      [charges, keys]
    end

    def track(table) = @tables << table

    # { order_id => times charged }
    def charge_counts(charges)
      exec("SELECT order_id, COUNT(*) FROM #{charges} GROUP BY order_id").values.to_h { |o, n| [o, Integer(n)] }
    end

    def charged(charges) = Integer(value("SELECT COUNT(DISTINCT order_id) FROM #{charges}"))

    # { order_id => epoch seconds of its (first) charge }
    def charge_times(charges)
      exec("SELECT order_id, EXTRACT(EPOCH FROM MIN(charged_at)) FROM #{charges} GROUP BY order_id")
        .values.to_h { |o, t| [o, Float(t)] }
    end

    # The relay phase's outbox queries. claimed_until is epoch ms, written
    # on the server's clock.
    def now_ms = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"

    def leasing_workers(table)
      exec("SELECT DISTINCT claimed_by FROM #{table} WHERE claimed_until > #{now_ms}").values.flatten
    end

    def leased_ids(table, worker)
      exec("SELECT id FROM #{table} WHERE claimed_by = $1 AND claimed_until > #{now_ms}", [worker]).values.flatten
    end

    def rows_left(table, ids)
      Integer(value("SELECT COUNT(*) FROM #{table} WHERE id = ANY($1::bigint[])", ["{#{ids.join(',')}}"]))
    end

    # A transaction on a connection of the phase's own (Drill.sql_connect).
    def transaction(conn, &) = conn.transaction(&)

    def drop_all
      @tables.uniq.each { |t| exec("DROP TABLE IF EXISTS #{t}") }
    ensure
      @conn.close
    end
  end

  # The drill's database for DATABASE_URL: PostgreSQL, or MySQL/MariaDB
  # for a mysql2:// URL (the phases that use only the charge tables: kill,
  # close, restart, poison, order, deadletters; see MYSQL_PHASES).
  def self.database(url = DATABASE_URL)
    url.start_with?("mysql2:") ? MysqlDatabase.new(url) : Database.new(url)
  end

  # The phases whose SQL is only MysqlDatabase's methods.
  MYSQL_PHASES = %w[kill close restart relays poison order deadletters].freeze

  # MySQL or MariaDB through mysql2: the same tables and answers as
  # Database. The key is VARBINARY, as acemq:install's migration makes it
  # there (docs/mysql.md), and the charge time is the server's, to the
  # microsecond.
  class MysqlDatabase
    def initialize(url)
      @conn = Drill.sql_connect(url)
      @tables = []
    end

    def charge_tables(prefix)
      charges = "#{prefix}_charges"
      keys = "#{prefix}_idem"
      @conn.query("CREATE TABLE #{charges} (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id VARCHAR(64) NOT NULL, " \
                  "pid INTEGER, charged_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))")
      @conn.query("CREATE TABLE #{keys} (message_id VARBINARY(255) PRIMARY KEY, state VARCHAR(16) NOT NULL, " \
                  "claimed_by VARCHAR(64), recorded_at DATETIME(6) NOT NULL, expires_at DATETIME(6) NOT NULL)")
      @tables.push(charges, keys)
      [charges, keys]
    end

    def track(table) = @tables << table

    def charge_counts(charges)
      @conn.query("SELECT order_id, COUNT(*) FROM #{charges} GROUP BY order_id", as: :array).to_a.to_h
    end

    def charged(charges) = @conn.query("SELECT COUNT(DISTINCT order_id) FROM #{charges}", as: :array).first.first

    # { order_id => epoch seconds of its first charge }: UNIX_TIMESTAMP of
    # a DATETIME reads it in the session's zone, the one it was written in.
    def charge_times(charges)
      @conn.query("SELECT order_id, UNIX_TIMESTAMP(MIN(charged_at)) FROM #{charges} GROUP BY order_id", as: :array)
           .to_a.to_h { |o, t| [o, Float(t)] }
    end

    # The same time core's MySQL dialect writes claimed_until in (UTC).
    def now_ms = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"

    def leasing_workers(table)
      @conn.query("SELECT DISTINCT claimed_by FROM #{table} WHERE claimed_until > #{now_ms}", as: :array).to_a.flatten
    end

    def leased_ids(table, worker)
      @conn.query("SELECT id FROM #{table} WHERE claimed_by = '#{@conn.escape(worker)}' AND claimed_until > #{now_ms}",
                  as: :array).to_a.flatten
    end

    def rows_left(table, ids)
      @conn.query("SELECT COUNT(*) FROM #{table} WHERE id IN (#{ids.map { |i| Integer(i) }.join(',')})", as: :array)
           .first.first
    end

    # mysql2 has no transaction block: BEGIN, then COMMIT or ROLLBACK.
    def transaction(conn)
      conn.query("BEGIN")
      r = yield
      conn.query("COMMIT")
      r
    rescue Exception # rubocop:disable Lint/RescueException
      conn.query("ROLLBACK") rescue nil # rubocop:disable Style/RescueModifier
      raise
    end

    def drop_all
      @tables.uniq.each { |t| @conn.query("DROP TABLE IF EXISTS #{t}") }
    ensure
      @conn.close
    end
  end

  # Bunny on the private node, for publishing and reading queues as any
  # other client would. Only in phases that leave the broker alone: a
  # session that loses its broker raises in the thread that opened it.
  class Broker
    def initialize(url)
      @url = url
    end

    def session
      @session ||= Bunny.new(@url, logger: Logger.new(nil), automatically_recover: false, connection_timeout: 2).tap(&:start)
    end

    def channel
      @channel = session.create_channel if @channel.nil? || !@channel.open?
      @channel
    end

    # Every message left in queue, taken off it: [[properties, body], ...].
    def take_all(queue, limit: 100_000)
      got = []
      loop do
        delivery, props, body = channel.basic_get(queue, manual_ack: false)
        break unless delivery

        got << [props, body]
        break if got.size >= limit
      end
      got
    end

    def close
      @session&.close
    rescue StandardError
      nil
    end
  end

  # The drill's publisher: each order once, retried with the same envelope
  # (so the same message id) until the broker confirms it. A publish that
  # raised while the broker was away may still have been stored: the retry
  # is then a duplicate, which is what the idempotent consumer is for.
  class Publisher
    # errors: { error class => how many publishes raised it }; longest: the
    # most seconds one message took from its first attempt to its confirm;
    # first_attempt: { order id => wall time its publish was first tried }.
    attr_reader :retries, :published, :errors, :longest, :first_attempt

    # url: one address or several (the nodes of a cluster, first tried first).
    def initialize(url, origin)
      @mq = AceMQ::AMQP::Connection.open(url, origin: origin, connect_timeout: 1, confirm_timeout: 5)
      @retries = 0
      @published = 0
      @errors = Hash.new(0)
      @longest = 0.0
      @first_attempt = {}
    end

    attr_reader :mq

    # partition: extra publish options (partition_key:, partitions:).
    def publish(payload, to:, exchange: "", deadline:, **partition)
      envelope = AceMQ::AMQP::Envelope.new(type: "drill.order.v1")
      first = Drill.now
      @first_attempt[payload["order_id"]] = Time.now.to_f if payload.is_a?(Hash)
      begin
        @mq.publish(payload, to: to, exchange: exchange, envelope: envelope, **partition)
        @published += 1
        @longest = [@longest, Drill.now - first].max
      rescue AceMQ::AMQP::Error => e
        raise Failure, "publisher: #{e.class}: #{e.message} (gave up at the phase deadline)" if Drill.now > deadline

        @retries += 1
        @errors[e.class.name.split("::").last] += 1
        on_error(e)
        sleep 0.1
        retry
      end
    end

    # Publish orders in a thread, `rate` a second until #hurry, then the
    # rest at once; returns the thread. The rate keeps messages arriving
    # while the faults happen; hurrying after the last one keeps the phase
    # short.
    def pace(orders, to:, rate:, deadline:, exchange: "")
      @hurry = false
      Thread.new do
        Thread.current.report_on_exception = false
        t0 = Drill.now
        orders.each_with_index do |order, i|
          ahead = t0 + i.fdiv(rate) - Drill.now
          sleep ahead if ahead.positive? && !@hurry
          publish({ "order_id" => order }, to: to, exchange: exchange, deadline: deadline)
        end
      end
    end

    def hurry = (@hurry = true)

    private def on_error(_error) = nil

    def close = @mq.close
  end
end
