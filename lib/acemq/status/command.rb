# frozen_string_literal: true

require "shellwords"
require "acemq/status"

module AceMQ
  class Status
    # `acemq status` and `bin/rails acemq:status`: builds a Status from the
    # application's configuration (or from --queue names alone), prints it,
    # and returns the exit status (0; 1 when the broker cannot be reached).
    class Command
      # queues: names given with --queue (then no consumer classes are
      # looked at); only: consumer class names; metrics: a URL, "none", or
      # nil for the health port's; rabbitmqctl: a command, "none", or nil
      # for `rabbitmqctl` when the broker is on this machine.
      def initialize(out: $stdout, err: $stderr, queues: [], only: nil, url: nil, metrics: nil, interval: 1,
                     rabbitmqctl: nil, json: false)
        @out = out
        @err = err
        @queues = queues
        @only = only
        @url = url
        @metrics = metrics
        @interval = interval
        @rabbitmqctl = rabbitmqctl
        @json = json
      end

      def run
        config = AceMQ::Rails.config
        url = @url || config.url
        targets = if @queues.empty?
                    AceMQ::Status.targets_for(AceMQ::Rails.consumers(only: @only))
                  else
                    @queues.map { |q| AceMQ::Status.target(q) }
                  end
        raise AMQP::ConfigurationError, "no consumers to look at: give --queue NAME, or run from the app" if targets.empty?

        mq = AMQP::Connection.open(url, origin: "#{config.origin}:status", connect_timeout: config.connect_timeout,
                                        tls: config.tls)
        begin
          status = AceMQ::Status.new(connection: mq, targets: targets, broker: redact(url), outbox: outbox_store,
                                     metrics_url: metrics_url(config), rabbitmqctl: rabbitmqctl(url),
                                     interval: @interval)
          snapshot = status.collect
          snapshot[:metrics_error] = @no_metrics if @no_metrics
          @out.puts(@json ? JSON.pretty_generate(snapshot) : AceMQ::Status.render(snapshot))
        ensure
          mq.close
        end
        0
      rescue AMQP::ConnectionError, AMQP::TimeoutError => e
        @err.puts("acemq: status: cannot reach the broker: #{e.message}")
        1
      end

      private

      # The runner serves /metrics beside /live and /ready on its health
      # port; on 0.0.0.0 it is reachable on 127.0.0.1 from the same host.
      def metrics_url(config)
        if @metrics == "none"
          @no_metrics = "--metrics none"
          return nil
        end
        return @metrics if @metrics

        port = config.health_port
        if port.nil? || Integer(port).zero?
          why = port.nil? ? "health_port is not set" : "health_port is 0 (any free port)"
          @no_metrics = "#{why}: give --metrics URL"
          return nil
        end
        host = config.health_host.to_s
        host = "127.0.0.1" if host.empty? || host == "0.0.0.0"
        "http://#{host}:#{Integer(port)}/metrics"
      end

      def rabbitmqctl(url)
        return nil if @rabbitmqctl == "none"

        uri = URI(url)
        vhost = uri.path.to_s.sub(%r{\A/}, "")
        vhost = vhost.empty? ? "/" : URI.decode_www_form_component(vhost)
        if @rabbitmqctl
          Rabbitmqctl.new(Shellwords.split(@rabbitmqctl), vhost: vhost)
        elsif Rabbitmqctl.local?(uri.host) && which("rabbitmqctl")
          Rabbitmqctl.new([which("rabbitmqctl")], vhost: vhost)
        end
      rescue URI::Error
        nil
      end

      def which(program)
        dirs = ENV.fetch("PATH", "").split(File::PATH_SEPARATOR) | %w[/usr/sbin /sbin]
        dirs.map { |d| File.join(d, program) }.find { |f| File.executable?(f) }
      end

      def outbox_store
        @queues.empty? ? AceMQ::Rails.outbox_store : nil
      end

      # The password never reaches a terminal, a log or a chat paste.
      def redact(url)
        url.split(/\s*,\s*/).map do |u|
          uri = URI(u)
          uri.password = nil if uri.password
          uri.to_s
        rescue URI::Error
          u
        end.join(",")
      end
    end
  end
end
