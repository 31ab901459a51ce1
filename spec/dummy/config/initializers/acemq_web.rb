# frozen_string_literal: true

# The dashboard mounted in config/routes.rb. A viewer sees everything and
# changes nothing: read-only is decided per request from the host's session.
# ACEMQ_WEB_QUEUES and ACEMQ_WEB_RUNNERS let a spec point it at its own
# queues and runner; without them it shows the app's consumers and the
# health port's runner.
AceMQ::Web.configure do |c|
  c.read_only = ->(env) { env["rack.session"]&.[]("operator") == "viewer" }
  c.queues = ENV["ACEMQ_WEB_QUEUES"]&.split(",")
  c.runners = ENV["ACEMQ_WEB_RUNNERS"]&.split(",")
end
