# frozen_string_literal: true

module AceMQ
  module Rails
    # What one consumer class does with an exception its handler raised:
    # a warn line in the log, and on Rails 7 and later Rails.error.report,
    # where the application's error tracker (Sentry, Honeybadger, Bugsnag,
    # AppSignal…) subscribes. It only reports: the subscription still
    # retries the message (rejects it, for a FatalError) as before, and a
    # reporter that fails changes nothing about the message.
    #
    # Without it a raising handler is a `retried` process event, logged at
    # debug, which a production log at info never shows and no tracker hears.
    class ErrorReport
      # Rails 7.1+ names where a report came from; Rails' own are
      # "application.active_support", "job.active_job" and the like.
      SOURCE = "handler.acemq"

      def initialize(consumer)
        @consumer = consumer
      end

      # Report error, raised by the handler for message.
      def call(error, message)
        context = context_for(message)
        log(error, context)
        reporter = self.class.reporter
        return unless reporter

        # handled: true because AceMQ handled it: the message is retried or
        # dead-lettered, not lost, and the process goes on (Rails then calls
        # it a :warning). Rails 7.1's reporter skips an exception it has
        # reported once, so the executor around the handler, which the
        # exception passes through, does not report it again as unhandled
        # (Rails 7.0's does: it has no such check).
        if self.class.source?
          reporter.report(error, handled: true, context: context, source: SOURCE)
        else
          reporter.report(error, handled: true, context: context)
        end
      rescue StandardError => e
        AceMQ::Rails.logger.warn("acemq: #{@consumer.name}: could not report #{error.class}: #{e.class}: #{e.message}")
      end

      class << self
        # Rails.error (ActiveSupport::ErrorReporter), or nil: Rails 6.1 has
        # none, and a script using AceMQ::Rails without Rails has no ::Rails.
        def reporter
          ::Rails.error if defined?(::Rails) && ::Rails.respond_to?(:error)
        end

        # Whether report takes source: (Rails 7.1 and later; 7.0 refuses it).
        def source?
          return @source if defined?(@source)

          @source = ::ActiveSupport::ErrorReporter.instance_method(:report).parameters.any? { |_, name| name == :source }
        end
      end

      private

      def context_for(message)
        delivery = message.respond_to?(:delivery) ? message.delivery : nil
        { consumer: @consumer.name, queue: @consumer.queue_name, message_id: message.id, message_type: message.type,
          attempt: message.attempt, routing_key: delivery&.routing_key, redelivered: delivery&.redelivered? }.compact
      end

      def log(error, context)
        where = error.backtrace&.first
        AceMQ::Rails.logger.warn(
          "acemq: #{context[:consumer]} raised on #{context[:queue]} #{context[:message_id]} attempt " \
          "#{context[:attempt]}: #{error.class}: #{error.message}#{where ? " (#{where})" : ''}"
        )
      end
    end
  end
end
