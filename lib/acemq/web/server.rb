# frozen_string_literal: true

require "stringio"
require "webrick"

module AceMQ
  class Web
    # `acemq web`: any Rack app (AceMQ::Web) on WEBrick, for an app without
    # Rails. WEBrick's own servlet API, not Rack's handler: Rack 3 moved its
    # handlers to the rackup gem, and this runs on Rack 2 and 3 alike.
    class Server
      attr_reader :port

      def initialize(app, host: "127.0.0.1", port: 9395, log: $stderr)
        @app = app
        logger = WEBrick::Log.new(log, WEBrick::Log::WARN)
        @server = WEBrick::HTTPServer.new(BindAddress: host, Port: Integer(port), Logger: logger, AccessLog: [])
        @port = @server.config[:Port]
        @server.mount_proc("/") { |req, res| serve(req, res) }
      end

      # A request still running when the server stops gets this long.
      STOP_WITHIN = 0.5

      def start = @server.start
      def shutdown = @server.shutdown

      # Stop listening, give running requests STOP_WITHIN seconds, then
      # end their threads: a browser's idle keep-alive connection would
      # otherwise hold WEBrick's shutdown for its whole timeout.
      def stop
        @server.shutdown
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + STOP_WITHIN
        loop do
          busy = workers
          break if busy.empty? || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

          sleep 0.05
        end
        workers.each(&:kill)
      end

      private

      # WEBrick's request threads (its own thread group).
      def workers = Thread.list.select { |t| t.alive? && t != Thread.current && t[:WEBrickThread] }

      def serve(req, res)
        status, headers, body = @app.call(env_of(req))
        res.status = status
        headers.each do |k, v|
          if k.downcase == "set-cookie"
            Array(v).flat_map { |c| c.split("\n") }.each { |c| res.cookies << c }
          else
            res[k] = Array(v).join(", ")
          end
        end
        out = +""
        body.each { |chunk| out << chunk }
        body.close if body.respond_to?(:close)
        res.body = out
      end

      def env_of(req)
        input = req.body.to_s
        env = {
          "REQUEST_METHOD" => req.request_method, "SCRIPT_NAME" => "", "PATH_INFO" => req.path,
          "QUERY_STRING" => req.query_string.to_s, "SERVER_NAME" => req.host.to_s, "SERVER_PORT" => req.port.to_s,
          "SERVER_PROTOCOL" => "HTTP/1.1", "REMOTE_ADDR" => req.peeraddr&.[](3).to_s,
          "rack.url_scheme" => "http", "rack.input" => StringIO.new(input), "rack.errors" => $stderr,
          "rack.version" => [1, 3], "rack.multithread" => true, "rack.multiprocess" => false, "rack.run_once" => false
        }
        env["CONTENT_TYPE"] = req.content_type if req.content_type
        env["CONTENT_LENGTH"] = input.bytesize.to_s unless input.empty?
        req.each do |name, value|
          next if %w[content-type content-length].include?(name)

          env["HTTP_#{name.upcase.tr('-', '_')}"] = value
        end
        env
      end
    end
  end
end
