# frozen_string_literal: true

# AceMQ: what the consumer runner (`bundle exec acemq run`, the Procfile's
# acemq line, or `bin/rails acemq:run`) and AceMQ::Rails.publisher read.
# Every setting has a default; these are the ones to decide per application.
AceMQ::Rails.configure do |c|
  # The broker, from the environment: credentials stay out of the repository,
  # and each environment (each developer) points at its own. The fallback is
  # a RabbitMQ on this machine with its default user.
  c.url = ENV.fetch("AMQP_URL", "amqp://guest:guest@localhost:5672")

  # Seconds a TERM gives the handlers running at that moment to finish
  # before the runner exits. Most platforms send KILL 30 seconds after TERM
  # (Heroku; Kubernetes' default terminationGracePeriodSeconds), so this
  # stays under 30: a handler cut off by the KILL has its message delivered
  # again, harmless to an idempotent consumer and a duplicate to any other.
  # A handler that can take longer needs both this and the platform's grace
  # period raised.
  c.shutdown_timeout = 25

  # The runner's health endpoint for a container's probes: /live, /ready and
  # /status (JSON). Off unless ACEMQ_HEALTH_PORT is set, because two runners
  # on one machine (development, a second process type) cannot share a port.
  c.health_port = ENV["ACEMQ_HEALTH_PORT"]&.then { |port| Integer(port) }

  # Dead letters as data: the runner ingests each consumer's {queue}.dlq
  # into the acemq_dead_letters table (the create_acemq_dead_letters
  # migration makes it), one ingester per DLQ however many runners there
  # are, and the operator browses and replays rows, not a queue
  # (docs/dead-letters.md in the gem). Off until uncommented.
  # c.dead_letter_store = :active_record
end
