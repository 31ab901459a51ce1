# frozen_string_literal: true

require "json"
require "net/http"
require "openssl"
require "uri"

module AceMQ
  class Web
    # The RabbitMQ management plugin's HTTP API, when its URL is given
    # (management_url, `acemq web --management URL`): every queue of the
    # vhost in one round trip, GET /api/queues/{vhost}?columns=..., with the
    # counts AMQP cannot give (unacknowledged; ready + unacked, which a
    # reader holding messages does not lower) and the head message's
    # timestamp. The broker in production is seldom on the dashboard's
    # machine, where rabbitmqctl would have to run. Basic auth from the URL's
    # user and password (guest:guest when it has none, as the plugin's
    # default).
    class Management
      COLUMNS = %w[name type messages messages_ready messages_unacknowledged consumers head_message_timestamp
                   idle_since].freeze
      TIMEOUT = 2

      class Unavailable < StandardError; end

      attr_reader :url

      # url: http(s)://user:password@host:15672/ (a path prefix is kept);
      # vhost: the AMQP URL's.
      def initialize(url, vhost: "/")
        @uri = URI(url.to_s)
        raise ArgumentError, "management URL must be http:// or https://, got #{url.inspect}" unless @uri.is_a?(URI::HTTP)

        @user = @uri.user ? URI.decode_www_form_component(@uri.user) : "guest"
        @password = @uri.password ? URI.decode_www_form_component(@uri.password) : "guest"
        @vhost = vhost
        @url = "#{@uri.scheme}://#{@uri.host}:#{@uri.port}#{@uri.path.chomp('/')}"
      end

      # The URL without its password, to show.
      def to_s = @url

      # { name => { ready:, unacked:, messages:, consumers:, type:,
      #   head_at: (a Time, or nil) } } for every queue of the vhost; raise
      # Unavailable with the reason.
      def queues
        path = "#{@uri.path.chomp('/')}/api/queues/#{URI.encode_www_form_component(@vhost)}"
        body = get("#{path}?columns=#{COLUMNS.join(',')}")
        list = JSON.parse(body)
        raise Unavailable, "#{self}: expected a list of queues, got #{body[0, 80].inspect}" unless list.is_a?(Array)

        list.each_with_object({}) do |q, all|
          next unless q.is_a?(Hash) && q["name"].is_a?(String)

          all[q["name"]] = { ready: int(q["messages_ready"]), unacked: int(q["messages_unacknowledged"]),
                             messages: int(q["messages"]), consumers: int(q["consumers"]), type: q["type"],
                             head_at: head_at(q["head_message_timestamp"]) }
        end
      rescue JSON::ParserError => e
        raise Unavailable, "#{self}: not JSON (#{e.message[0, 80]})"
      end

      # The broker's own samples of one queue over the last `seconds`, one
      # every `every` (what the plugin keeps: 10 minutes at 5 s by default),
      # oldest first: { ready: [[at, n]], messages: [[at, n]] }, at in
      # seconds since the epoch. The dashboard's chart starts from them, so
      # a restart of the dashboard does not empty it.
      def history(queue, seconds: 600, every: 5)
        path = "#{@uri.path.chomp('/')}/api/queues/#{URI.encode_www_form_component(@vhost)}/#{URI.encode_www_form_component(queue)}"
        q = JSON.parse(get("#{path}?lengths_age=#{Integer(seconds)}&lengths_incr=#{Integer(every)}"))
        raise Unavailable, "#{self}: expected a queue, got #{q.class}" unless q.is_a?(Hash)

        series = lambda do |key|
          samples = q.dig(key, "samples")
          next [] unless samples.is_a?(Array)

          samples.filter_map { |s| [s["timestamp"] / 1000.0, s["sample"]] if s.is_a?(Hash) && s["timestamp"].is_a?(Integer) && s["sample"].is_a?(Integer) }
                 .sort_by(&:first)
        end
        { ready: series.call("messages_ready_details"), messages: series.call("messages_details") }
      rescue JSON::ParserError => e
        raise Unavailable, "#{self}: not JSON (#{e.message[0, 80]})"
      end

      private

      def get(path)
        http = Net::HTTP.new(@uri.host, @uri.port)
        http.use_ssl = @uri.scheme == "https"
        http.open_timeout = TIMEOUT
        http.read_timeout = TIMEOUT
        req = Net::HTTP::Get.new(path)
        req.basic_auth(@user, @password)
        res = http.request(req)
        raise Unavailable, "#{self} answered #{res.code} #{res.message.to_s.strip}" unless res.is_a?(Net::HTTPSuccess)

        res.body.to_s
      rescue SystemCallError, IOError, SocketError, Timeout::Error, OpenSSL::SSL::SSLError => e
        raise Unavailable, "#{self} unreachable: #{e.message}"
      end

      def int(value) = value.is_a?(Integer) ? value : nil

      # Seconds since the epoch (the message's timestamp property), the
      # plugin's "" or nil when the queue is empty or the head has none.
      def head_at(value) = value.is_a?(Integer) && value.positive? ? Time.at(value) : nil
    end
  end
end
