# frozen_string_literal: true

# The runner the drill kills: the guide's PaymentsConsumer shape on
# PostgreSQL through the shipped ActiveRecord store, charging each order id
# into a table. `acemq run -r drill/charge_app.rb`, everything set by the
# environment (spec/fixtures/runner_ar_app.rb is its model; this one adds a
# health endpoint and file, and takes its claim timeout from the drill).
require "active_record"
require "acemq"
require "acemq/rails/active_record_idempotency_store"

# POOL: the ordering drill's runner has a handler thread per partition.
# On MySQL, encoding: utf8mb4 as a Rails app's generated database.yml has
# it: a bare mysql2:// URL opens utf8mb3, which the stores refuse.
DB_CONFIG = { url: ENV.fetch("DATABASE_URL") }
DB_CONFIG[:pool] = Integer(ENV["POOL"]) if ENV["POOL"]
DB_CONFIG[:encoding] = "utf8mb4" if DB_CONFIG[:url].start_with?("mysql2:")
ActiveRecord::Base.establish_connection(DB_CONFIG)
ActiveRecord::Base.logger = nil

class DrillCharge < ActiveRecord::Base
  self.table_name = ENV.fetch("CHARGES_TABLE")
end

class DrillPaymentsConsumer < AceMQ::Rails::Consumer
  queue ENV.fetch("QUEUE"), type: ENV["QUEUE_TYPE"]&.to_sym
  concurrency Integer(ENV.fetch("CONCURRENCY", "2"))
  prefetch Integer(ENV["PREFETCH"]) if ENV["PREFETCH"]
  # The ordering drill (drill/ordering.rb): one queue per partition, each
  # consumed by one runner at a time, an order's partition by its account.
  partitions Integer(ENV["PARTITIONS"]), by: ->(m) { m.payload.fetch("account_id") } if ENV["PARTITIONS"]
  # A claim left by a killed runner is taken over after this long, so the
  # drill does not wait the default five minutes for it.
  # WORKER_ID: a worker id that is not hostname:pid, so a dead runner's
  # claim cannot be proven dead and is waited out (the ordering drill's
  # DRILL_ORDER_WORKER_IDS, what runners on other hosts see).
  STORE = AceMQ::Rails::ActiveRecordIdempotencyStore.new(table: ENV.fetch("IDEMPOTENCY_TABLE"),
                                                         claim_timeout: Float(ENV.fetch("CLAIM_TIMEOUT", "1")),
                                                         worker: ENV["WORKER_ID"])
  # Room for a redelivery to wait out a dead runner's claim (retried as in
  # progress until it goes stale) and a broker restart, with attempts left.
  retries max_attempts: 10, initial_delay: 0.25, max_delay: 1
  # With LOG_DELIVERIES the key function (which the guard calls once for
  # every delivery, before it decides) logs each one: how the cluster drill
  # counts the duplicates the guard absorbed without running the handler.
  if ENV["LOG_DELIVERIES"]
    idempotent store: STORE, key: lambda { |m|
      File.open(ENV.fetch("LOG"), "a") do |f|
        # The last field: whether this copy came back from a rung of the
        # ladder (a retry, or a wait for a claim): the ordering drill counts
        # them, and the order of every copy.
        f.puts("delivery #{m.payload.fetch('order_id')} #{format('%.6f', Time.now.to_f)} " \
               "#{m.delivery&.redelivered? ? 'redelivered' : 'first'} " \
               "#{m.attempt > 1 || m.headers.key?('x-acemq-waits') ? 'ladder' : 'queue'}")
      end
      m.envelope&.id
    }
  else
    idempotent store: STORE
  end

  # With LOG_DELIVERIES the guard's takeovers of a dead runner's claim and
  # its holds in place are logged too (the ordering drill counts them).
  if ENV["LOG_DELIVERIES"]
    AceMQ::Events.subscribe("idempotency.acemq") do |e|
      next unless %w[taken_over held].include?(e[:verdict].to_s)

      order = e[:message]&.payload&.fetch("order_id", nil)
      File.open(ENV.fetch("LOG"), "a") { |f| f.puts("#{e[:verdict]} #{order} #{format('%.6f', Time.now.to_f)}") }
    end
  end

  # A charge takes this long inside its transaction (a payment gateway's
  # round trip), so a kill usually lands in the middle of one.
  WORK = Float(ENV.fetch("WORK_SECONDS", "0"))

  # The guide's transaction: the charge and the confirm commit together, so
  # a runner killed after the commit has nothing left to do twice, and one
  # killed before it has rolled back. The log lines (with the wall clock)
  # are how the drill times a takeover.
  def call(message)
    order = message.payload.fetch("order_id")
    # Whether this copy went round the ladder (a retry, or a wait for a dead
    # runner's claim): the ordering drill counts them (and checks their order
    # with every other copy's).
    log("start", order, message.attempt > 1 || message.headers.key?("x-acemq-waits") ? "retried" : "first")
    ActiveRecord::Base.transaction do
      DrillCharge.create!(order_id: order, pid: Process.pid)
      sleep WORK if WORK.positive?
      STORE.confirm(message.envelope.id)
    end
    log("charged", order)
    accept
  end

  private

  def log(what, order, note = nil)
    File.open(ENV.fetch("LOG"), "a") { |f| f.puts("#{what} #{order} #{format('%.6f', Time.now.to_f)}#{note && " #{note}"}") }
  end
end

AceMQ::Rails.configure do |c|
  # AMQP_URL may list several nodes, comma-separated: the first is dialled
  # first (the cluster drill gives each runner a different one).
  urls = ENV.fetch("AMQP_URL").split(",")
  c.url = urls.size == 1 ? urls.first : urls
  c.origin = ENV.fetch("ORIGIN")
  c.check_interval = 0.2
  c.shutdown_timeout = 5
  c.connect_timeout = 2
  # The network drill (drill/net.rb) asks for a short heartbeat: how a
  # half-open connection is found.
  c.heartbeat = Float(ENV["HEARTBEAT"]) if ENV["HEARTBEAT"]
  c.health_port = 0
  c.health_host = "127.0.0.1"
  c.health_file = ENV["HEALTH_FILE"]
end

# An orphan (the drill gone without reaping it) stops itself as a TERM
# would, rather than consuming for ever.
DRILL_PARENT = Process.ppid
Thread.new do
  sleep 0.5 while Process.ppid == DRILL_PARENT
  Process.kill("TERM", Process.pid)
end
