# frozen_string_literal: true

require "net/http"
require "uri"

module AceMQ
  # A runner's control requests, over its health endpoint: what `acemq ctl`
  # sends, and what a dashboard or a script can send.
  #
  #   AceMQ::Control.new("http://127.0.0.1:9394").pause("PaymentsConsumer")
  #
  # A runner takes them from 127.0.0.1, or from anywhere with its control
  # token (config.control_token, ACEMQ_CONTROL_TOKEN), sent here as
  # Authorization: Bearer. Against `acemq run --processes N` the parent
  # passes them on to every worker, and to each one forked later.
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

    def initialize(url, token: ENV.fetch("ACEMQ_CONTROL_TOKEN", nil), timeout: 10)
      @uri = URI(url.to_s.sub(%r{/+\z}, ""))
      @token = token
      @timeout = timeout
    end

    # Pause the consumer class `name`: it takes nothing more and gives back
    # what it had buffered, unspent. Returns the runner's answer.
    def pause(name) = post(name, "pause")

    # Take deliveries again.
    def resume(name) = post(name, "resume")

    # The runner's /status, parsed.
    def status
      require "json"
      JSON.parse(request(Net::HTTP::Get.new(path("/status"))).body)
    end

    private

    def post(name, action)
      request(Net::HTTP::Post.new(path("/consumers/#{URI.encode_www_form_component(name.to_s)}/#{action}"))).body.strip
    end

    def path(p) = "#{@uri.path}#{p}"

    def request(req)
      req["Authorization"] = "Bearer #{@token}" if @token && !@token.empty?
      res = Net::HTTP.start(@uri.host, @uri.port, open_timeout: @timeout, read_timeout: @timeout) { |h| h.request(req) }
      raise Refused.new(res.code.to_i, res.body.to_s.strip) unless res.code == "200"

      res
    end
  end
end
