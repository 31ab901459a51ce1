# frozen_string_literal: true

# The runner of the dead-letter drill (drill/dead_letter_phases.rb):
# `acemq run -r drill/dead_letter_app.rb`, everything set by the environment.
# Its consumer of QUEUE declines what it is given; the drill publishes its
# dead letters straight to QUEUE.dlq, so what is measured is the runner's
# ingester alone. The store is on DATABASE_URL (PostgreSQL or MySQL), in
# DEAD_LETTER_TABLE and its _audit, opened in the runner process by the
# callable.
require "acemq"
require_relative "sql_connect"

class DrillDeadLetterConsumer < AceMQ::Rails::Consumer
  queue ENV.fetch("QUEUE")

  def call(_message) = reject("drill: declined")
end

AceMQ::Rails.configure do |c|
  c.url = ENV.fetch("AMQP_URL")
  c.origin = ENV.fetch("ORIGIN")
  c.shutdown_timeout = 5
  c.health_port = 0
  c.health_host = "127.0.0.1"
  c.check_interval = 0.1
  # A standby asks for the DLQ this often: the takeover after a kill.
  c.dead_letter_retry_every = Float(ENV.fetch("RETRY_EVERY", "0.5"))
  c.dead_letter_store = lambda do
    table = ENV.fetch("DEAD_LETTER_TABLE")
    AceMQ::AMQP::SQLDeadLetterStore.new(connection: Drill.sql_connect(ENV.fetch("DATABASE_URL")), table: table,
                                        audit_table: "#{table}_audit")
  end
end
