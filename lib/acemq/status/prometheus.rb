# frozen_string_literal: true

require "net/http"
require "uri"

module AceMQ
  class Status
    # The runner's /metrics, read the way Prometheus reads it: the text
    # exposition format, one sample a line. Only what `acemq status` needs
    # (names, labels, values); comments, HELP and TYPE lines are skipped.
    module Prometheus
      # The names the runner exports (docs/events.md is the reference; they
      # follow the OpenTelemetry messaging conventions). Every delivery the
      # runner settled is one count of CONSUMED, labelled with its queue and
      # its outcome. The guide's counter worth graphing is how often
      # first_time? answered false: a key already confirmed (duplicate) or
      # only claimed, its message sent back to wait (in_progress).
      CONSUMED = "messaging_client_consumed_messages_total"
      DESTINATION_LABEL = "messaging_destination_name"
      OUTCOME_LABEL = "outcome"
      NOT_FIRST_TIME = %w[duplicate in_progress].freeze

      SAMPLE = /\A([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?\s*\z/.freeze
      LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*/.freeze

      Sample = Struct.new(:name, :labels, :value)

      # Every sample in text, as Sample(name, labels Hash, Float value).
      def self.parse(text)
        text.each_line.filter_map do |line|
          line = line.strip
          next if line.empty? || line.start_with?("#")

          m = SAMPLE.match(line) or next
          labels = {}
          m[2]&.scan(LABEL) { |k, v| labels[k] = unescape(v) }
          value = Float(m[3].sub(/\A\+?Inf\z/, "Infinity"), exception: false) or next
          Sample.new(m[1], labels, value)
        end
      end

      # A label value as written: \\, \" and \n escaped.
      def self.unescape(value) = value.gsub(/\\(.)/) { Regexp.last_match(1) == "n" ? "\n" : Regexp.last_match(1) }

      # The samples at url, or raise Unavailable saying why not.
      def self.scrape(url, timeout: 2)
        uri = URI(url)
        response = Net::HTTP.start(uri.host, uri.port, open_timeout: timeout, read_timeout: timeout) do |http|
          http.get(uri.request_uri)
        end
        raise Unavailable, "HTTP #{response.code}" unless response.is_a?(Net::HTTPSuccess)

        parse(response.body.to_s)
      rescue SystemCallError, IOError, SocketError, Timeout::Error, URI::Error => e
        raise Unavailable, e.message
      end

      # Sum of CONSUMED for queue, by outcome: { "accepted" => 12.0, ... };
      # nil when the runner exports no such metric at all.
      def self.consumed(samples, queue)
        mine = samples.select { |s| s.name == CONSUMED }
        return nil if mine.empty?

        mine.select { |s| s.labels[DESTINATION_LABEL] == queue }
            .each_with_object(Hash.new(0.0)) { |s, h| h[s.labels[OUTCOME_LABEL] || "unknown"] += s.value }
      end

      # Whether gauge `name` is 1 for queue (acemq_consumer_paused,
      # acemq_circuit_open); nil when the runner exports no such sample.
      def self.flag(samples, name, queue)
        mine = samples.select { |s| s.name == name && s.labels[DESTINATION_LABEL] == queue }
        mine.empty? ? nil : mine.any? { |s| s.value.positive? }
      end

      # The endpoint is not there (no runner, another port, an error page).
      class Unavailable < StandardError; end
    end
  end
end
