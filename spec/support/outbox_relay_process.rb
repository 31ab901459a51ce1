# frozen_string_literal: true

# One relay process for the multi-process outbox specs: sweeps until the
# outbox is empty, then exits 0. With ACEMQ_FAULT_INJECT=exit-after-publish
# it exits 86 after its first confirmed batch, before deleting the rows.
#
#   ruby -Ilib spec/support/outbox_relay_process.rb --db sqlite:/tmp/x.db --table t --batch 20 --worker w1
#
# With --mode start it runs relay.start instead (the started relay's held
# deletes and wake-ups) and exits once the table is empty, as counted on a
# connection of its own, then closes the relay.
#
# Loaded by spec_helper too (every file in support/ is): only runs as a script.
if $PROGRAM_NAME == __FILE__
  require "acemq/amqp"
  require "acemq/amqp/patterns"

  args = ARGV.each_slice(2).to_h { |k, v| [k.delete_prefix("--").to_sym, v] }
  mysql = lambda do
    require "mysql2"
    require "uri"
    u = URI(args[:db])
    Mysql2::Client.new(host: u.host, port: u.port || 3306, username: u.user, password: u.password,
                       database: u.path.delete_prefix("/"), encoding: "utf8mb4")
  end
  db = if args[:db].start_with?("sqlite:")
         require "sqlite3"
         SQLite3::Database.new(args[:db].delete_prefix("sqlite:")).tap do |d|
           d.busy_timeout = 10_000
           d.execute("PRAGMA journal_mode = WAL")
         end
       elsif args[:db].start_with?("mysql2:")
         mysql.call
       else
         require "pg"
         PG.connect(args[:db]).tap { |c| c.set_notice_processor { |_| } }
       end
  mq = AceMQ::AMQP::Connection.open(args.fetch(:amqp))
  store = AceMQ::AMQP::Patterns::SQLOutboxStore.new(connection: db, table: args[:table], worker: args[:worker],
                                                    lease: Float(args.fetch(:lease, "60")))
  relay = AceMQ::AMQP::Patterns::OutboxRelay.new(mq, store, batch_size: Integer(args.fetch(:batch, "20")),
                                                            on_error: ->(e, **) { warn("relay: #{e.message}") })
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 25
  if args[:mode] == "start"
    count = if args[:db].start_with?("sqlite:")
              counter = SQLite3::Database.new(args[:db].delete_prefix("sqlite:")).tap { |d| d.busy_timeout = 10_000 }
              -> { counter.get_first_value("SELECT COUNT(*) FROM #{args[:table]}") }
            elsif args[:db].start_with?("mysql2:")
              counter = mysql.call
              -> { counter.query("SELECT COUNT(*) FROM #{args[:table]}", as: :array).first.first }
            else
              counter = PG.connect(args[:db])
              -> { Integer(counter.exec("SELECT COUNT(*) FROM #{args[:table]}").getvalue(0, 0)) }
            end
    relay.start
    sleep 0.05 until count.call.zero? || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    relay.close
    mq.close
    exit!(0)
  end
  loop do
    sent = relay.sweep
    break if sent.zero? && store.backlog.count.zero?
    break if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

    sleep 0.01 if sent.zero?
  end
  mq.close
  exit!(0)
end
