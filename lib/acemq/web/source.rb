# frozen_string_literal: true

require "net/http"
require "acemq/status"

module AceMQ
  class Web
    # Where the dashboard's numbers come from: the broker (AceMQ::Status's
    # passive declares, one pass), the runners' health endpoints (/status
    # and /metrics), the outbox store, and the DLQ read of the engine
    # (Connection#browse_dead_letters, the path peek and replay take). It
    # keeps the samples the overview takes (ten minutes of them), from which
    # the rates and the queue page's chart are drawn.
    class Source
      KEEP = 600 # seconds of samples
      # The queue page's newest dead letters are the last of this many read
      # from the head (a DLQ is read oldest first): Status::PEEK_LIMIT.
      NEWEST_SCAN = Status::PEEK_LIMIT
      RUNNER_TIMEOUT = 1

      Sample = Struct.new(:at, :ready, :done, :dlq, keyword_init: true)

      attr_reader :config

      def initialize(config)
        @config = config
        @lock = Mutex.new
        @samples = Hash.new { |h, k| h[k] = [] }
        @ctl_lock = Mutex.new
        @ctl_listing = nil
        @ctl_at = nil
      end

      def close
        @lock.synchronize do
          @mq&.close unless @config.connection
          @mq = nil
        end
      end

      def connection
        @lock.synchronize do
          return @config.connection if @config.connection

          @mq = nil if @mq&.closed?
          @mq ||= AMQP::Connection.open(url, origin: "acemq-web")
        end
      end

      def targets
        @targets ||= if @config.queues
                       Array(@config.queues).map { |q| Status.target(q.to_s) }
                     elsif defined?(AceMQ::Rails) && AceMQ::Rails.respond_to?(:consumers)
                       Status.targets_for(AceMQ::Rails.consumers)
                     else
                       []
                     end
      end

      def target(queue) = targets.find { |t| t.queue == queue }

      def runners
        @runners ||= if @config.runners
                       Array(@config.runners).map { |u| u.to_s.chomp("/") }
                     elsif defined?(AceMQ::Rails) && AceMQ::Rails.respond_to?(:config) && AceMQ::Rails.config.health_port
                         .to_i.positive?
                       c = AceMQ::Rails.config
                       host = c.health_host.to_s
                       host = "127.0.0.1" if host.empty? || host == "0.0.0.0"
                       ["http://#{host}:#{Integer(c.health_port)}"]
                     else
                       []
                     end
      end

      def outbox
        return @config.outbox if @config.outbox
        return AceMQ::Rails.outbox_store if defined?(AceMQ::Rails) && AceMQ::Rails.respond_to?(:outbox_store)

        nil
      end

      # The overview: one sample of every queue (kept), every runner's
      # /status, the outbox. Rates come from the kept samples.
      def overview
        status = Status.new(connection: connection, targets: targets, outbox: outbox, interval: 0,
                            metrics_url: runners.first&.then { |r| "#{r}/metrics" })
        snap = status.sample(unacked_listing)
        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        snap[:consumers].each do |c|
          q = c[:queue]
          keep(q[:name], Sample.new(at: now, ready: q[:ready], done: q[:consumed_total]&.values&.sum,
                                    dlq: c[:dlq][:ready]))
          q.merge!(rates(q[:name]))
        end
        snap[:runners] = runners.map { |r| runner(r) }
        snap
      end

      def samples(queue) = @lock.synchronize { @samples[queue].dup }

      # A sample of one queue (its ready and DLQ counts), kept: the queue
      # page's chart refreshes from it.
      def sample_queue(target)
        status = Status.new(connection: connection, targets: [target], interval: 0,
                            metrics_url: runners.first&.then { |r| "#{r}/metrics" })
        c = status.sample[:consumers].first
        keep(target.queue, Sample.new(at: Process.clock_gettime(Process::CLOCK_MONOTONIC), ready: c[:queue][:ready],
                                      done: c[:queue][:consumed_total]&.values&.sum, dlq: c[:dlq][:ready]))
      end

      # One page of the DLQ, with what it cost.
      def browse(queue, page:, filter:)
        size = Integer(@config.page_size || 25)
        t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        result = connection.browse_dead_letters(queue, limit: size, skip: (page - 1) * size, **filter)
        result.merge(dead_letters: result[:dead_letters].map { |d| Source.readable(d) },
                     ms: ((Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0) * 1000).round, page: page,
                     page_size: size)
      end

      # The newest dead letters: the last `count` of the first NEWEST_SCAN.
      def newest(queue, count)
        r = connection.browse_dead_letters(queue, limit: NEWEST_SCAN)
        r.merge(dead_letters: r[:dead_letters].last(count).reverse.map { |d| Source.readable(d) })
      end

      # The latest time a failure can claim: 9999-12-31T23:59:59Z.
      LAST_TIME = 253_402_300_799

      # A dead letter as the pages show it. Its headers are whatever its
      # publisher (or anyone who may publish to its queue or DLQ) chose:
      # x-acemq-history of any shape, a failed-at that is no time. So
      # :history is a list of entries, each { reason:, error_class:,
      # attempts:, failed_at: (a Time or nil), failed_at_text: } read from a
      # Hash, every field as text, or { text: } for an entry that is not a
      # Hash (shown as it is, JSON for what is not a string); a history that
      # is not an array is one entry. :failed_at is a Time only for a number
      # of seconds from 1970 to 9999, and :failed_at_text the header as text
      # otherwise. Nothing in it makes the page fail.
      def self.readable(letter)
        headers = letter[:headers].is_a?(Hash) ? letter[:headers] : {}
        history = headers.key?("x-acemq-history") ? headers["x-acemq-history"] : []
        entries = (history.is_a?(Array) ? history : [history])
        failed_at, failed_at_text = time_of(headers["x-acemq-failed-at"])
        letter.merge(history: entries.map { |e| history_entry(e) }, failed_at: failed_at, failed_at_text: failed_at_text)
      end

      def self.history_entry(entry)
        return { text: text_of(entry) } unless entry.is_a?(Hash)

        failed_at, failed_at_text = time_of(entry["failed_at"])
        { reason: field_text(entry["reason"]), error_class: field_text(entry["error_class"]),
          attempts: field_text(entry["attempts"]), failed_at: failed_at, failed_at_text: failed_at_text }
      end

      # [a Time, nil] for seconds since the epoch in range; [nil, its text]
      # for anything else; [nil, nil] for none.
      def self.time_of(value)
        return [nil, nil] if value.nil?
        if value.is_a?(Numeric) && value.real? && value.to_f.finite? && value >= 0 && value <= LAST_TIME
          return [Time.at(value), nil]
        end

        [nil, text_of(value)]
      end

      def self.field_text(value) = value.nil? ? nil : text_of(value)

      # A header value as text: a string as it is, anything else as JSON.
      def self.text_of(value)
        return value if value.is_a?(String)

        JSON.generate(value)
      rescue JSON::JSONError, EncodingError, SystemStackError
        value.inspect
      end

      def counts(name) = connection.queue_counts(name)

      # POST /consumers/NAME/pause|resume on a runner's health endpoint, with
      # its control token when one is set (ACEMQ_CONTROL_TOKEN): [code, body].
      def control(base, name, action)
        uri = URI("#{base}/consumers/#{URI.encode_www_form_component(name)}/#{action}")
        req = Net::HTTP::Post.new(uri.request_uri)
        token = @config.control_token || ENV.fetch("ACEMQ_CONTROL_TOKEN", nil)
        req["Authorization"] = "Bearer #{token}" if token && !token.empty?
        res = Net::HTTP.start(uri.host, uri.port, open_timeout: RUNNER_TIMEOUT, read_timeout: 5) { |h| h.request(req) }
        [res.code.to_i, res.body.to_s]
      rescue SystemCallError, IOError, SocketError, Timeout::Error => e
        [502, e.message]
      end

      private

      def url
        @config.url || (defined?(AceMQ::Rails) && AceMQ::Rails.respond_to?(:config) && AceMQ::Rails.config.url) ||
          ENV.fetch("AMQP_URL", "amqp://guest:guest@localhost:5672")
      end

      def keep(queue, sample)
        @lock.synchronize do
          list = @samples[queue]
          list << sample
          list.shift while list.first.at < sample.at - KEEP
        end
      end

      # Change per second of ready and done against the newest sample at
      # least a second older than the last (two refreshes of the page).
      def rates(queue)
        list = samples(queue)
        last = list.last or return {}
        prev = list.reverse_each.find { |s| s.at <= last.at - 1 } or return {}

        dt = last.at - prev.at
        out = {}
        out[:ready_change_per_s] = ((last.ready - prev.ready) / dt).round(1) if last.ready && prev.ready
        done = list.select(&:done)
        if done.size > 1 && (d0 = done.reverse_each.find { |s| s.at <= done.last.at - 1 })
          out[:done_per_s] = ((done.last.done - d0.done) / (done.last.at - d0.at)).round(1)
        end
        out
      end

      # A runner's /status, as one runner or as a swarm's parent (children
      # with their own /status inside): the processes, each with its
      # state, restarts and consumers (with a paused state where the runner
      # reports one).
      def runner(base)
        uri = URI("#{base}/status")
        res = Net::HTTP.start(uri.host, uri.port, open_timeout: RUNNER_TIMEOUT, read_timeout: RUNNER_TIMEOUT) do |h|
          h.get(uri.request_uri)
        end
        body = JSON.parse(res.body.to_s)
        processes = if body["children"]
                      body["children"].map do |c|
                        own = c["runner"].is_a?(Hash) ? c["runner"] : {}
                        { label: "process #{c['index']}", pid: c["pid"], state: own["state"] || c["state"],
                          ready: own["ready"], restarts: c["restarts"], consumers: consumers_of(own) }
                      end
                    else
                      [{ label: "runner", pid: body["pid"], state: body["state"], ready: body["ready"],
                         restarts: consumers_of(body).sum { |c| c[:restarts].to_i }, consumers: consumers_of(body) }]
                    end
        { url: base, ok: res.is_a?(Net::HTTPSuccess), state: body["state"], quiet: body["quiet"],
          processes: processes }
      rescue SystemCallError, IOError, SocketError, Timeout::Error, JSON::ParserError, URI::Error => e
        { url: base, ok: false, error: e.message, processes: [] }
      end

      def consumers_of(status)
        Array(status["consumers"]).map do |c|
          state = c["state"] || (c["paused"] ? "paused" : nil) || (c["up"] == false ? "down" : "up")
          { name: c["name"], queue: c["queue"], state: state, restarts: c["restarts"], last_failure: c["last_failure"],
            paused: c["paused"] ? true : false, breaker: c["breaker"] }
        end
      end

      # rabbitmqctl list_queues takes a second or two: run in the
      # background at most every 5 s; the overview shows the last listing.
      def unacked_listing
        return nil unless @config.rabbitmqctl

        @ctl_lock.synchronize do
          stale = @ctl_at.nil? || Process.clock_gettime(Process::CLOCK_MONOTONIC) - @ctl_at > 5
          if stale && !@ctl_thread&.alive?
            ctl = Status::Rabbitmqctl.new(Array(@config.rabbitmqctl).flat_map { |c| c.to_s.split }, vhost: vhost)
            @ctl_thread = Thread.new do
              listing = begin
                ctl.list_queues
              rescue Status::Rabbitmqctl::Unavailable
                nil
              end
              @ctl_lock.synchronize do
                @ctl_listing = listing
                @ctl_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
              end
            end
          end
          @ctl_listing
        end
      end

      def vhost
        v = URI(url.split(",").first).path.to_s.sub(%r{\A/}, "")
        v.empty? ? "/" : URI.decode_www_form_component(v)
      rescue URI::Error
        "/"
      end
    end
  end
end
