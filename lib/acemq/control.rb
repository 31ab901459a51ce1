# frozen_string_literal: true

require "net/http"
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

    # timeout: seconds to connect; read_timeout: seconds for the answer (by
    # default timeout:). A pause waits for the runner's broker round trips.
    def initialize(url, token: ENV.fetch("ACEMQ_CONTROL_TOKEN", nil), timeout: 10, read_timeout: nil)
      @uri = begin
        URI(url.to_s.sub(%r{/+\z}, ""))
      rescue URI::Error
        nil
      end
      unless @uri.is_a?(URI::HTTP) && @uri.host && !@uri.host.empty?
        raise InvalidURL, "a runner's endpoint is an http:// URL such as http://127.0.0.1:9394, got #{url.to_s.inspect}"
      end

      @token = token
      @timeout = timeout
      @read_timeout = read_timeout || timeout
    end

    # Pause the consumer class `name`: it takes nothing more and gives back
    # what it had buffered, unspent. Returns the runner's answer.
    def pause(name) = post(name, "pause")

    # Take deliveries again.
    def resume(name) = post(name, "resume")

    # The runner's /status, parsed.
    def status
      require "json"
      JSON.parse(accepted(call(:get, "/status")))
    end

    # One request to the endpoint, with the token when there is one:
    # [code, body] whatever the code. Raises Unreachable when nothing
    # answers.
    def call(method, path)
      req = (method.to_s.casecmp?("post") ? Net::HTTP::Post : Net::HTTP::Get).new("#{@uri.path}#{path}")
      req["Authorization"] = "Bearer #{@token}" if @token && !@token.to_s.empty?
      res = Net::HTTP.start(@uri.host, @uri.port, open_timeout: @timeout, read_timeout: @read_timeout) { |h| h.request(req) }
      [res.code.to_i, res.body.to_s]
    rescue SystemCallError, IOError, SocketError, Timeout::Error, Net::HTTPBadResponse => e
      raise Unreachable, "#{@uri}#{path}: #{e.message}"
    end

    private

    def post(name, action) = accepted(call(:post, "/consumers/#{URI.encode_www_form_component(name.to_s)}/#{action}")).strip

    def accepted((code, body))
      raise Refused.new(code, body.strip) unless code == 200

      body
    end
  end
end
