# frozen_string_literal: true

require "active_support/log_subscriber"

module AceMQ
  module Rails
    # The events as log lines, attached under the `acemq` namespace by the
    # Railtie: one line per message at debug (so a production log at info
    # says nothing about messages that went well), failures at warn, the
    # runner's and the connection's changes at info. Its logger is
    # AceMQ::Rails.logger (Rails.logger unless configured).
    class LogSubscriber < ActiveSupport::LogSubscriber
      # Outcomes that mean somebody should look. error_replied is a request's
      # handler that failed (its requester has the error, nothing is on the
      # DLQ to say so); expired, a request nobody answered in time.
      LOUD = %w[dead_lettered timed_out failed error_replied expired].freeze

      def process(event)
        p = event.payload
        line = "AceMQ process #{p[:consumer]} #{p[:message_id]} #{p[:outcome]} attempt #{p[:attempt]} " \
               "(#{ms(p[:duration])})#{because(p)}"
        LOUD.include?(p[:outcome]) ? warn(line) : debug(line)
      end

      def publish(event)
        p = event.payload
        line = "AceMQ publish #{destination(p)} #{p[:message_id]} #{p[:outcome]} (#{ms(p[:duration])})" \
               "#{p[:error] ? ": #{p[:error]}" : ''}"
        p[:outcome] == "confirmed" ? debug(line) : warn(line)
      end

      def retry(event)
        p = event.payload
        debug("AceMQ retry #{p[:queue]} #{p[:message_id]} attempt #{p[:attempt]} to #{p[:rung]}#{because(p)}")
      end

      def dead_letter(event)
        p = event.payload
        warn("AceMQ dead_letter #{p[:queue]} #{p[:message_id]} attempt #{p[:attempt]} to #{p[:dlq]}#{because(p)}")
      end

      def idempotency(event)
        p = event.payload
        line = "AceMQ idempotency #{p[:verdict]} #{p[:key].inspect}#{p[:error] ? ": #{p[:error]}" : ''}"
        %w[duplicate in_progress].include?(p[:verdict]) ? debug(line) : warn(line)
      end

      def outbox(event)
        p = event.payload
        line = "AceMQ outbox published #{p[:published]} of #{p[:claimed]}" \
               "#{p[:backlog] ? ", backlog #{p[:backlog]}" : ''}"
        return debug(line) if p[:failed].to_i.zero?

        warn("#{line}, #{p[:failed]} failed: " +
             p[:errors].first(3).map { |e| "#{destination(e)}: #{e[:error]}" }.join("; "))
      end

      def connection(event)
        p = event.payload
        line = "AceMQ connection #{p[:state]} #{p[:endpoint]}#{p[:reason] ? ": #{p[:reason]}" : ''}"
        %w[lost blocked].include?(p[:state]) ? warn(line) : info(line)
      end

      def subscription(event)
        p = event.payload
        line = "AceMQ subscription #{p[:state]} #{p[:queue]}#{p[:reason] ? ": #{p[:reason]}" : ''}"
        # A loss, a breaker that opened or a shared throttle's store that
        # failed is a warning; coming back, an operator's pause and the
        # breaker's other steps are information.
        %w[failed cancelled circuit_open throttle_store_failed].include?(p[:state].to_s) ? warn(line) : info(line)
      end

      def runner(event)
        p = event.payload
        line = "AceMQ runner #{p[:state]}#{p[:reason] ? ": #{p[:reason]}" : ''}"
        p[:state] == "failed" ? warn(line) : info(line)
      end

      private

      def logger = AceMQ::Rails.logger

      def ms(seconds) = seconds ? format("%.1fms", seconds * 1000) : "-"

      def because(p)
        return "" unless p[:reason]

        ": #{p[:error_class] ? "#{p[:error_class]}: " : ''}#{p[:reason]}"
      end

      def destination(p) = p[:exchange].to_s.empty? ? p[:routing_key] : "#{p[:exchange]}/#{p[:routing_key]}"
    end
  end
end
