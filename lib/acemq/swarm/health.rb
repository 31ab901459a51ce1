# frozen_string_literal: true

require "json"
require "socket"
require "time"
require "uri"
require "acemq/control"

module AceMQ
  class Swarm
    # The parent's one health endpoint, over every child. Plain Ruby on a
    # thread of the parent: the parent runs no engine runtime, so the
    # children it forks later (restarts) are forked from a process with no
    # tokio threads and no sockets but this listening one, which they close.
    #
    # Each child serves its own Runner endpoint on 127.0.0.1 (any free port,
    # reported to the parent through a pipe); the parent asks them:
    #
    #   /live     200 while the parent supervises (not given up) and every
    #             running child answers /live 200. A child being forked
    #             again counts as live: the parent is handling it.
    #   /ready    200 when every one of the N children is running and
    #             answers /ready 200; 503 while one is dead, booting or quiet.
    #   /metrics  each child's Prometheus text with process="INDEX" added
    #             to every sample, each family's samples together; plus the
    #             parent's acemq_processes and acemq_process_restarts_total.
    #   /status   JSON: the parent's state and each child's index, pid, state,
    #             restarts, last exit and the child's own /status.
    #   POST /consumers/NAME/pause (or /resume): passed on to every running
    #             child (with the control token, which each child asks for
    #             too), and remembered for the children forked later; 200
    #             when every child answered 200. Taken as a runner takes
    #             them: from 127.0.0.1, or with the control token as
    #             Authorization: Bearer once one is set (core's check).
    class Health
      # A child that does not answer within this is neither live nor ready.
      CHILD_TIMEOUT = 1.0

      attr_reader :port

      def initialize(swarm, host:, port:)
        @swarm = swarm
        @server = TCPServer.new(host.empty? ? "0.0.0.0" : host, port)
        @port = @server.addr[1]
        @thread = Thread.new { serve }
        @thread.name = "acemq-health"
      end

      def close
        @server.close unless @server.closed?
        @thread&.join(1)
      rescue IOError
        nil
      end

      # In a forked child: the socket is the parent's; closing our copy of
      # the descriptor leaves the parent's listening.
      def close_in_child
        @server.close unless @server.closed?
      rescue IOError
        nil
      end

      # [code, content type, body] for a path: what the socket answers.
      def answer(path)
        case path
        when "/live", "/livez" then word(live?, "live")
        when "/ready", "/readyz" then word(ready?, "ready")
        when "/", "/status" then [200, "application/json", JSON.generate(status)]
        when "/metrics" then [200, "text/plain; version=0.0.4", metrics]
        else [404, "text/plain", "not found: try /live, /ready, /status or /metrics\n"]
        end
      end

      def live?
        snap = @swarm.snapshot
        return false if snap[:state] == :failed || !@swarm.beating?

        snap[:children].all? { |c| c[:state] != :running || c[:health_port].nil? || ask(c[:health_port], "/live")&.first == 200 }
      end

      def ready?
        snap = @swarm.snapshot
        return false unless snap[:state] == :running

        snap[:children].all? { |c| c[:state] == :running && (c[:health_port].nil? || ask(c[:health_port], "/ready")&.first == 200) }
      end

      def status
        snap = @swarm.snapshot
        children = snap[:children].map do |c|
          own = c[:health_port] && ask(c[:health_port], "/status")
          body = own && (JSON.parse(own[1]) rescue own[1]) # rubocop:disable Style/RescueModifier
          { index: c[:index], pid: c[:pid], state: c[:state], restarts: c[:total_restarts], last_exit: c[:last_exit],
            started_at: c[:started_at], runner: body }
        end
        { state: snap[:state], pid: snap[:pid], processes: snap[:processes], quiet: snap[:quiet], children: children }
      end

      # Prometheus text wants each family's samples together: the children's
      # are grouped under the family they appeared in (the last # TYPE seen).
      def metrics
        snap = @swarm.snapshot
        families = {}
        order = []
        snap[:children].each do |c|
          text = c[:health_port] && ask(c[:health_port], "/metrics")&.last
          next unless text

          family = nil
          text.each_line(chomp: true) do |line|
            next if line.empty?

            if (m = line.match(/\A# (HELP|TYPE) (\S+)/))
              family = m[2]
              order << family unless families.key?(family)
              families[family] ||= { meta: [], samples: [] }
              families[family][:meta] << line unless families[family][:meta].include?(line)
              next
            end
            next if line.start_with?("#")

            family ||= line[/\A[^{\s]+/]
            unless families.key?(family)
              order << family
              families[family] = { meta: [], samples: [] }
            end
            families[family][:samples] << label(line, c[:index])
          end
        end
        out = +""
        out << "# HELP acemq_processes Worker processes by state.\n# TYPE acemq_processes gauge\n"
        snap[:children].group_by { |c| c[:state] }.each { |state, cs| out << "acemq_processes{state=\"#{state}\"} #{cs.size}\n" }
        out << "# HELP acemq_process_restarts_total Times a worker process was forked again after it died.\n" \
               "# TYPE acemq_process_restarts_total counter\n"
        snap[:children].each { |c| out << "acemq_process_restarts_total{process=\"#{c[:index]}\"} #{c[:total_restarts]}\n" }
        order.each do |f|
          families[f][:meta].each { |l| out << l << "\n" }
          families[f][:samples].each { |l| out << l << "\n" }
        end
        out
      end

      private

      def label(line, index)
        name, rest = line.split(/(?=[{\s])/, 2)
        if rest&.start_with?("{}")
          "#{name}{process=\"#{index}\"}#{rest[2..]}"
        elsif rest&.start_with?("{")
          "#{name}{process=\"#{index}\",#{rest[1..]}"
        else
          "#{name}{process=\"#{index}\"}#{rest}"
        end
      end

      def word(ok, what) = ok ? [200, "text/plain", "#{what}\n"] : [503, "text/plain", "not #{what}\n"]

      # POST /consumers/NAME/pause|resume from `peer` (an Addrinfo):
      # [code, content type, body].
      def control(path, request, peer)
        # Core's check, the one each worker's endpoint makes.
        loopback = peer ? (peer.ipv4_loopback? || peer.ipv6_loopback?) : false
        refused = AMQP::NativeSupervisor.authorize_control(@swarm.control_token, request, loopback)
        return [403, "text/plain", refused] if refused

        m = path.match(%r{\A/consumers/([^/]+)/(pause|resume)\z})
        return [404, "text/plain", "not found: POST /consumers/NAME/pause or /consumers/NAME/resume\n"] unless m

        name = URI.decode_www_form_component(m[1])
        running = @swarm.snapshot[:children].select { |c| c[:state] == :running && c[:health_port] }
        answers = running.map { |c| ask(c[:health_port], "/consumers/#{m[1]}/#{m[2]}", method: "POST") }
        return [404, "text/plain", answers.find { |a| a&.first == 404 }[1]] if answers.any? { |a| a&.first == 404 }

        @swarm.note_paused(name, m[2] == "pause")
        failed = answers.count { |a| a&.first != 200 }
        unless failed.zero?
          which = running.zip(answers).reject { |_, a| a&.first == 200 }.map { |c, a| "process #{c[:index]} (pid #{c[:pid]}): #{a ? "#{a.first} #{a.last.strip}" : 'no answer'}" }
          return [503, "text/plain", "#{m[2]} #{name}: #{failed} of #{answers.size} did not answer 200: #{which.join('; ')}\n"]
        end

        [200, "text/plain", "#{m[2] == 'pause' ? 'paused' : 'resumed'} #{name} in #{answers.size == 1 ? '1 process' : "#{answers.size} processes"}\n"]
      end

      # GET (or POST) to a child's endpoint, through the one control client
      # and with the control token a worker asks for as the parent does:
      # [code, body], or nil when it does not answer. A pause waits for the
      # child's broker round trips.
      def ask(port, path, method: "GET")
        post = method == "POST"
        Control.new("http://127.0.0.1:#{port}", token: @swarm.control_token, timeout: CHILD_TIMEOUT,
                                                read_timeout: post ? 10 : CHILD_TIMEOUT).call(method, path)
      rescue Control::Unreachable
        nil
      end

      # Each connection on a thread of its own, at most CLIENTS at once: a
      # probe is never held up by an idle connection (a port scanner, a
      # TCP-only load-balancer check) or by a pause waiting on a stopped
      # worker. Past CLIENTS a connection is closed at once.
      CLIENTS = 16

      def serve
        clients = []
        loop do
          client = @server.accept
          clients.select!(&:alive?)
          if clients.size >= CLIENTS
            client.close
            next
          end
          clients << Thread.new(client) { |c| handle(c) }
        rescue IOError, Errno::EBADF
          break # closed
        rescue StandardError
          next
        end
      end

      def handle(client)
        return unless client.wait_readable(2)

        request = client.readpartial(8192)
        path = request[/\A[A-Z]+ (\S+)/, 1].to_s.sub(/\?.*/, "")
        code, type, body = request.start_with?("POST") ? control(path, request, client.remote_address) : answer(path)
        reason = { 200 => "OK", 403 => "Forbidden", 404 => "Not Found", 503 => "Service Unavailable" }.fetch(code)
        client.write("HTTP/1.1 #{code} #{reason}\r\nContent-Type: #{type}\r\nContent-Length: #{body.bytesize}\r\n" \
                     "Connection: close\r\n\r\n#{body}")
      rescue StandardError
        nil
      ensure
        client.close rescue nil # rubocop:disable Style/RescueModifier
      end
    end
  end
end
