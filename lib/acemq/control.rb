# frozen_string_literal: true

require "net/http"
require "openssl"
require "timeout"
require "uri"

module AceMQ
  # The one client of a runner's health and control endpoint: what
  # `acemq ctl` sends, what the dashboard reads and sends, what the
  # --processes parent asks its workers, and what a script can send.
  #
  #   AceMQ::Control.new("http://127.0.0.1:9394").pause("PaymentsConsumer")
  #
  # A runner takes control requests from 127.0.0.1, or from anywhere with
  # its control token (config.control_token, ACEMQ_CONTROL_TOKEN), sent here
  # as Authorization: Bearer. Once a runner has a token it asks for it from
  # 127.0.0.1 too. Against `acemq run --processes N` the parent passes them
  # on to every worker (with the same token), and to each one forked later.
  class Control
    # The runner answered, but not 200: the message is its own (an unknown
    # consumer names the ones it runs; a refusal says what to send).
    class Refused < StandardError
      attr_reader :code

      def initialize(code, message)
        @code = code
        super(message)
      end
    end

    # Nothing answered at the URL within the timeout: no runner there, or a
    # runner too busy to answer. The message names the URL.
    class Unreachable < StandardError; end

    # The URL is not a runner's endpoint (http://HOST:PORT).
    class InvalidURL < ArgumentError; end

    # What cannot be sent: a token with a line break inside, an empty
    # consumer name.
    class InvalidRequest < ArgumentError; end

    # At most so much of an answer's body goes into a Refused message.
    MESSAGE_LIMIT = 1_000

    # timeout: seconds to connect; read_timeout: seconds for the whole
    # answer (by default timeout:): a pause waits for the runner's broker
    # round trips. https:// is spoken where a proxy in front of the runner
    # terminates TLS; the token never goes over a plain connection to a URL
    # that said https. The token is read as a secret file holds it: without
    # the whitespace around it.
    def initialize(url, token: ENV.fetch("ACEMQ_CONTROL_TOKEN", nil), timeout: 10, read_timeout: nil)
      @uri = self.class.endpoint(url)
      @token = token.nil? ? nil : token.to_s.strip
      if @token&.match?(/[\r\n\0]/)
        raise InvalidRequest, "the control token has a line break inside it: give the token alone (ACEMQ_CONTROL_TOKEN)"
      end

      @timeout = timeout
      @read_timeout = read_timeout || timeout
    end

    # The URI of a runner's endpoint, or InvalidURL saying what one is.
    def self.endpoint(url)
      uri = begin
        URI(url.to_s.sub(%r{/+\z}, ""))
      rescue URI::Error
        nil
      end
      problem = if !uri.is_a?(URI::HTTP) || uri.host.to_s.empty? then "not an http:// URL"
                elsif !uri.port.between?(1, 65_535) then "port #{uri.port} is not 1 to 65535"
                elsif uri.userinfo then "it has a user and password: send the control token (ACEMQ_CONTROL_TOKEN) instead"
                elsif uri.query || uri.fragment then "it has a query or fragment, which the endpoint reads as part of the path"
                end
      return uri unless problem

      shown = uri&.userinfo ? url.to_s.sub("#{uri.userinfo}@", "") : url.to_s
      raise InvalidURL, "a runner's endpoint is a URL such as http://127.0.0.1:9394 (#{problem}), got #{url.nil? ? 'nil' : shown.inspect}"
    end

    # Pause the consumer class `name`: it takes nothing more and gives back
    # what it had buffered, unspent. Returns the runner's answer.
    def pause(name) = post(name, "pause")

    # Take deliveries again.
    def resume(name) = post(name, "resume")

    # The runner's /status, parsed.
    def status
      require "json"
      body = accepted(call(:get, "/status"), "/status")
      JSON.parse(body)
    rescue JSON::ParserError
      raise Refused.new(200, "#{@uri}/status answered something that is not a runner's JSON status: #{body.to_s[0, 80].inspect}")
    end

    # One request to the endpoint, with the token when there is one:
    # [code, body] whatever the code. Raises Unreachable when nothing
    # answers within timeout: + read_timeout: in all (a server that drips
    # its answer, or keeps saying 100 Continue, included); never retried.
    def call(method, path)
      req = (method.to_s.casecmp?("post") ? Net::HTTP::Post : Net::HTTP::Get).new("#{@uri.path}#{path}")
      req["Authorization"] = "Bearer #{@token}" unless @token.nil? || @token.empty?
      http = Net::HTTP.new(@uri.hostname, @uri.port)
      http.use_ssl = @uri.is_a?(URI::HTTPS)
      http.open_timeout = @timeout
      http.read_timeout = @read_timeout
      http.max_retries = 0
      res = Timeout.timeout(@timeout + @read_timeout, Timeout::Error) { http.start { |h| h.request(req) } }
      [res.code.to_i, res.body.to_s]
    rescue SystemCallError, IOError, SocketError, Timeout::Error, Net::HTTPBadResponse, OpenSSL::SSL::SSLError => e
      raise Unreachable, "#{@uri}#{path}: #{e.message}"
    end

    # A consumer class name as one path segment: everything but letters,
    # digits, _ - and ~ percent-encoded (so "..", "a b" and "A::B" cannot
    # be read as anything else by a proxy on the way).
    def self.segment(name)
      text = name.to_s
      raise InvalidRequest, "a consumer is named by its class name, e.g. PaymentsConsumer (got #{name.inspect})" if text.strip.empty?

      text.b.gsub(/[^A-Za-z0-9_~-]/) { |c| format("%%%02X", c.ord) }
    end

    private

    def post(name, action)
      path = "/consumers/#{Control.segment(name)}/#{action}"
      accepted(call(:post, path), path).strip
    end

    def accepted((code, body), path)
      return body if code == 200

      text = body.to_s.strip
      text = "#{@uri}#{path} answered #{code} with no message: is that a runner's health endpoint?" if text.empty?
      text = "#{text[0, MESSAGE_LIMIT]}…" if text.length > MESSAGE_LIMIT
      raise Refused.new(code, text)
    end
  end
end
