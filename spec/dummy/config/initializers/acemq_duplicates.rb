# frozen_string_literal: true

# The guide's "counter worth graphing" (how often first_time? answered
# false), as a log line: in this app it is what shows a duplicate delivery
# being turned away (`rake demo:rails` prints it).
AceMQ::AMQP::Patterns.on_duplicate do |_event, detail|
  Rails.logger.info("acemq: duplicate #{detail[:key]} accepted without running the handler")
end
