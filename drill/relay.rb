# frozen_string_literal: true

# One outbox relay process for the drill: OutboxRelay#start on a PostgreSQL
# outbox table until TERM (then close: the sweep in progress finishes) or
# until the drill kills it with SIGKILL, which is the point.
#
#   ruby -Ilib drill/relay.rb --db postgres://... --amqp amqp://... --table t --worker w --lease 1 --batch 10
#
# spec/support/outbox_relay_process.rb is the specs' one-shot relay (it
# sweeps until the table is empty and exits); this one runs as a deployed
# relay does, on its own thread, for as long as it lives.
require "acemq/amqp"
require "acemq/amqp/patterns"
require_relative "sql_connect"

args = ARGV.each_slice(2).to_h { |k, v| [k.delete_prefix("--").to_sym, v] }
$stdout.sync = true

# Signals arrive on a pipe: a trap handler may not take the relay's lock.
wake_r, wake_w = IO.pipe
%w[TERM INT].each { |sig| trap(sig) { wake_w.write_nonblock(".", exception: false) } }

# Per thread (the relay's own), so a connection the server dropped (a
# restart, pg_terminate_backend) is replaced at the next sweep.
# --db is PostgreSQL, or MySQL/MariaDB for a mysql2:// URL.
db = AceMQ::AMQP::SQL.per_thread { Drill.sql_connect(args.fetch(:db)) }
mq = AceMQ::AMQP::Connection.open(args.fetch(:amqp), origin: "drill-relay-#{args.fetch(:worker)}", connect_timeout: 2)
store = AceMQ::AMQP::Patterns::SQLOutboxStore.new(connection: db, table: args.fetch(:table), worker: args.fetch(:worker),
                                                  lease: Float(args.fetch(:lease, "1")), backoff: 0.2, max_backoff: 1)
relay = AceMQ::AMQP::Patterns::OutboxRelay.new(mq, store, interval: Float(args.fetch(:interval, "0.05")),
                                                          batch_size: Integer(args.fetch(:batch, "10")),
                                                          on_error: ->(e, **) { warn("relay: #{e.class}: #{e.message}") })
relay.start
puts "relay running (pid #{Process.pid})"

parent = Process.ppid
# Bounded even if the drill dies without reaping it: an orphan (its parent
# gone) stops by itself instead of relaying forever.
loop do
  break if IO.select([wake_r], nil, nil, 0.5)
  break if Process.ppid != parent
end
relay.close
mq.close
puts "relay stopped"
exit!(0)
