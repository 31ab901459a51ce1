# frozen_string_literal: true

require "acemq/control"
require "acemq/status"
require "acemq/web/management"

module AceMQ
  class Web
    # Where the dashboard's numbers come from: the broker (AceMQ::Status's
    # passive declares, one pass), the runners' health endpoints (/status
    # and /metrics), the outbox store, and the DLQ read of the engine
    # (Connection#browse_dead_letters, the path peek and replay take). It
    # keeps the samples the overview takes (ten minutes of them), from which
    # the rates and the queue page's chart are drawn.
    #
    # The pages ask this class for everything they show and do in queue
    # mode. In store mode (a dead-letter store configured) the DLQ pages
    # call the store itself (StorePages), which this class resolves and
    # keeps (dead_letter_store): its rules are the store's, shared with Rust.
    class Source
      KEEP = 600 # seconds of samples
      # The queue page's newest dead letters are the last of this many read
      # from the head (a DLQ is read oldest first): Status::PEEK_LIMIT.
      NEWEST_SCAN = Status::PEEK_LIMIT
      RUNNER_TIMEOUT = 1
      # AMQP's connection-level reply codes: the connection is gone
      # (320 when a node is stopped), not this request refused.
      CONNECTION_CLOSED = [320, 501, 502, 503, 504, 505, 506, 530, 540, 541].freeze
      # A filter on a deep DLQ reads every message it passes over, and a deep
      # one cannot be read within a page's wait: it gives up after this many
      # seconds (read_within) and the page says how far it read.
      READ_WITHIN = 5
      # After the broker could not be reached, pages say so for this long
      # without dialling again: a page must not wait for a connect timeout
      # on every request while the broker is down.
      REDIAL_AFTER = 3
      CONNECT_TIMEOUT = 3

      Sample = Struct.new(:at, :ready, :done, :dlq, keyword_init: true)

      # The broker could not be reached (or the connection failed): which
      # URL (without its password), and why.
      class BrokerDown < StandardError
        attr_reader :url, :reason

        def initialize(url, reason)
          @url = url
          @reason = reason
          super("broker unreachable at #{url}: #{reason}")
        end
      end

      # The dead-letter store could not be built (its setting, its database).
      class StoreUnavailable < StandardError; end

      attr_reader :config

      def initialize(config)
        @config = config
        @store_lock = Mutex.new
        @lock = Mutex.new
        @samples = Hash.new { |h, k| h[k] = [] }
        @seeded = {} # queues whose samples start with the broker's (#seed)
        @ctl_lock = Mutex.new
        @ctl_listing = nil
        @ctl_at = nil
        @reading = {}
        @down = nil
        @replays_lock = Mutex.new
        @replays = []
      end

      # A store replay the page started in the background, and how it ended.
      BackgroundReplay = Struct.new(:queue, :actor, :selected, :rate, :started_at, :thread, :report, :error, keyword_init: true) do
        def running? = thread.alive?
      end

      # Run a store replay in a thread of its own (the block, given the
      # connection), so a page does not wait minutes for a paced replay.
      # Listed by #replays while it runs, and for an hour after.
      def replay_in_background(queue:, actor:, selected:, rate:)
        entry = BackgroundReplay.new(queue: queue, actor: actor, selected: selected, rate: rate, started_at: Time.now)
        @replays_lock.synchronize do
          @replays.reject! { |r| !r.running? && r.started_at < Time.now - 3600 }
          entry.thread = Thread.new do
            Thread.current.report_on_exception = false
            entry.report = yield(connection)
          rescue StandardError => e
            entry.error = "#{e.class}: #{e.message}"
          end
          @replays << entry
        end
        entry
      end

      # This process's background replays, newest first.
      def replays = @replays_lock.synchronize { @replays.reverse }

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
          return @mq if @mq

          at, reason = @down
          raise BrokerDown.new(shown_url, reason) if at && now - at < REDIAL_AFTER

          begin
            @mq = AMQP::Connection.open(url, origin: "acemq-web", connect_timeout: CONNECT_TIMEOUT)
            @down = nil
            @mq
          rescue AMQP::Error => e
            @down = [now, "#{e.class.name.split('::').last}: #{e.message}"]
            raise BrokerDown.new(shown_url, @down.last)
          end
        end
      end

      # Store mode: the dashboard's dead_letter_store setting, else the Rails
      # app's (AceMQ::Rails.config.dead_letter_store, the runner's); false
      # turns it off where the app has one.
      def store_setting
        given = @config.dead_letter_store
        return nil if given == false
        return given unless given.nil?

        defined?(AceMQ::Rails) && AceMQ::Rails.respond_to?(:config) ? AceMQ::Rails.config.dead_letter_store : nil
      end

      def store_configured? = !store_setting.nil?

      # The store, built once per dashboard on first use by the one
      # resolution the runner uses (SQLDeadLetterStore.resolve: a store, a
      # callable, :active_record, a URL or a SQLite path), or nil.
      def dead_letter_store
        @store_lock.synchronize do
          return @store if defined?(@store)

          setting = store_setting
          @store = setting.nil? ? nil : AMQP::SQLDeadLetterStore.resolve(setting)
        end
      rescue AMQP::ConfigurationError, AMQP::Error, LoadError => e
        raise StoreUnavailable, "#{e.class.name.split('::').last}: #{e.message}"
      end

      # The AMQP URL without its password, to show.
      def shown_url
        u = URI(url.split(",").first)
        u.password = nil if u.password
        u.user = nil if u.user
        u.to_s
      rescue URI::Error
        "(the configured URL)"
      end

      # The management API (Management) when management_url is set, else nil.
      def management
        return @management if defined?(@management)

        @management = @config.management_url && Management.new(@config.management_url, vhost: vhost)
      end

      # The consumers' queues (their own retry policies give the rungs), or
      # the queues named in the settings. A queue named by the settings has
      # the rungs the settings give (rungs: delays such as "1s", or full
      # names; one list for all, or a Hash by queue); else, with the
      # management API, the queues named "{queue}.retry.*" that exist; else
      # none shown. The default ladder is never assumed: a consumer with its
      # own retries: has other rungs.
      def targets
        return @targets if @targets

        # One listing for all: a queue's rungs are the names it holds.
        listing = management_listing if @config.queues && management && !@config.rungs.is_a?(Array)
        list = if @config.queues
                 Array(@config.queues).map { |q| named_target(q.to_s, listing) }
               elsif defined?(AceMQ::Rails) && AceMQ::Rails.respond_to?(:consumers)
                 Status.targets_for(AceMQ::Rails.consumers)
               else
                 []
               end
        # Rungs read from the broker are kept once it has answered.
        @targets = list unless list.any? { |t| t.rungs.nil? }
        list.map { |t| t.rungs.nil? ? Status::Target.new(**t.to_h.merge(rungs: [])) : t }
      end

      def named_target(queue, listing)
        rungs = @config.rungs.is_a?(Hash) ? @config.rungs[queue] || @config.rungs[queue.to_sym] : @config.rungs
        rungs = if rungs
                  Array(rungs).map { |r| r.to_s.start_with?("#{queue}.") ? r.to_s : "#{queue}.retry.#{r}" }
                elsif management
                  listing && rungs_from_broker(queue, listing)
                else
                  []
                end
        Status::Target.new(name: nil, queue: queue, rungs: rungs, dlq: "#{queue}.dlq")
      end

      # "{queue}.retry.{delay}" queues the broker has, shortest delay first
      # (targets asks again next time when the management API did not
      # answer).
      def rungs_from_broker(queue, listing)
        prefix = "#{queue}.retry."
        listing.keys.select { |n| n.start_with?(prefix) && n.delete_prefix(prefix).match?(/\A[\d.]+[a-z]*\z/) }
               .sort_by { |n| delay_of(n.delete_prefix(prefix)) }
      end

      def delay_of(text)
        n = text.to_f
        { "ms" => 0.001, "s" => 1, "m" => 60, "min" => 60, "h" => 3600, "d" => 86_400 }.fetch(text[/[a-z]+\z/].to_s, 1) * n
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
      #
      # With the management API, every count comes from its one listing
      # (no passive declare), unacked among them, and a DLQ's total is
      # ready + unacked: a reader holding messages does not lower it.
      # Without it, a DLQ this process is reading shows the count taken
      # before the read. With the broker down the snapshot says so
      # (:broker_error) and carries what does not need it: the runners,
      # the outbox.
      def overview
        listing = management_listing
        snap = begin
          status = Status.new(connection: connection, targets: targets, outbox: outbox, interval: 0,
                              metrics_url: runners.first&.then { |r| "#{r}/metrics" })
          counts = listing&.transform_values { |q| q.slice(:ready, :consumers) } || counts_in_parallel(status.queue_names)
          status.sample(listing || unacked_listing, counts: counts, delayed: delayed_levels)
        rescue BrokerDown, AMQP::ConnectionError, AMQP::TimeoutError => e
          down_snapshot(e)
        rescue AMQP::BrokerError => e
          # A node being stopped closes the connection with 320
          # (CONNECTION_FORCED), a broker error rather than a lost socket.
          raise unless CONNECTION_CLOSED.include?(e.reply_code)

          down_snapshot(e)
        end
        at = now
        snap[:consumers].each do |c|
          q = c[:queue]
          [q, c[:dlq], *c[:rungs]].each { |row| totals(row, listing) }
          reading = @lock.synchronize { @reading[c[:dlq][:name]] }
          c[:dlq].merge!(total: reading, being_read: true) if reading && !listing
          next unless q[:exists]

          keep(q[:name], Sample.new(at: at, ready: q[:ready], done: q[:consumed_total]&.values&.sum, dlq: c[:dlq][:total]))
          q.merge!(rates(q[:name]))
        end
        snap[:management] = management && { url: management.to_s, error: @management_error }
        snap[:runners] = runners.map { |r| runner(r) }
        snap
      end

      # What is up and what is down, for the page that says so.
      def health(error = nil)
        broker = begin
          connection
          { ok: true, url: shown_url }
        rescue BrokerDown => e
          { ok: false, url: e.url, error: e.reason }
        end
        broker = { ok: false, url: shown_url, error: error.message } if error && broker[:ok]
        listing = management_listing
        { broker: broker, management: management && { ok: !listing.nil?, url: management.to_s, error: @management_error },
          runners: runners.map { |r| runner(r) }, outbox: outbox && Status.new(connection: nil, targets: [], outbox: outbox).send(:outbox) }
      end

      def samples(queue) = @lock.synchronize { @samples[queue].dup }

      # A sample of one queue (its ready and DLQ counts), kept: the queue
      # page's chart refreshes from it.
      def sample_queue(target)
        seed(target) if management && !@lock.synchronize { @seeded[target.queue] }
        listing = management_listing
        status = Status.new(connection: connection, targets: [target], interval: 0,
                            metrics_url: runners.first&.then { |r| "#{r}/metrics" })
        c = status.sample(listing, counts: listing&.transform_values { |q| q.slice(:ready, :consumers) })[:consumers].first
        totals(c[:dlq], listing)
        keep(target.queue, Sample.new(at: now, ready: c[:queue][:ready],
                                      done: c[:queue][:consumed_total]&.values&.sum, dlq: c[:dlq][:total]))
      end

      # One page of the DLQ, with what it cost. A filter gives up after
      # read_within seconds (READ_WITHIN) and says how far it read.
      def browse(queue, page:, filter:)
        size = Integer(@config.page_size || 25)
        t0 = now
        result = reading(queue) do
          connection.browse_dead_letters(queue, limit: size, skip: (page - 1) * size, within: read_within, **filter)
        end
        # The page's own Hash (the views add what it cost): DeadLetters::Page#to_h.
        result.to_h.merge(dead_letters: result.dead_letters.map { |d| Source.readable(d.to_h) },
                     ms: ((now - t0) * 1000).round, page: page, page_size: size, within: read_within)
      end

      def read_within = Float(@config.read_within || READ_WITHIN)

      # The newest dead letters: the last `count` of the first NEWEST_SCAN.
      def newest(queue, count)
        r = reading(queue) { connection.browse_dead_letters(queue, limit: NEWEST_SCAN, within: read_within) }
        all = r.dead_letters.map { |d| Source.readable(d.to_h) }
        r.to_h.merge(dead_letters: all.last(count).reverse, oldest_at: all.first&.dig(:failed_at))
      end

      # The actions, each a report of what was done (DeadLetters::ReplayReport,
      # DiscardReport, PurgeReport).
      def replay(queue, ids: nil, filter: {})
        reading(queue) do
          ids ? connection.replay_dead_letters(queue, ids: ids) : connection.replay_dead_letters(queue, **filter)
        end
      end

      def discard(queue, ids:) = reading(queue) { connection.discard_dead_letters(queue, ids: ids) }

      def purge(queue) = reading(queue) { connection.purge_dead_letters(queue) }

      # Whether the error says another reader holds the DLQ (core's 405).
      def self.busy?(error) = error.is_a?(AMQP::BrokerError) && error.reply_code == 405

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

      # { ready:, consumers: } of one queue (nil when it does not exist),
      # with unacked, total and the head's age where the management API
      # gives them.
      def counts(name)
        listing = management_listing
        row = listing ? listing[name]&.dup : connection.queue_counts(name)
        row && totals(row.merge(name: name, exists: true), listing)
      end

      # POST /consumers/NAME/pause|resume on a runner's health endpoint, with
      # its control token when one is set (ACEMQ_CONTROL_TOKEN): [code, body].
      def control(base, name, action)
        token = @config.control_token || ENV.fetch("ACEMQ_CONTROL_TOKEN", nil)
        Control.new(base, token: token, timeout: RUNNER_TIMEOUT, read_timeout: 5)
               .call(:post, "/consumers/#{URI.encode_www_form_component(name)}/#{action}")
      rescue Control::Unreachable, Control::InvalidURL => e
        [502, e.message]
      end

      private

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

      # Every queue from the management API in one round trip; nil (and the
      # reason kept for the page) when it is not configured or not answering.
      def management_listing
        return nil unless management

        listing = management.queues
        @management_error = nil
        listing
      rescue Management::Unavailable => e
        @management_error = e.message
        nil
      end

      # A row's total (ready + unacked when unacked is known, else ready)
      # and its head message's time, from the listing.
      def totals(row, listing)
        return row unless row[:exists]

        m = listing&.[](row[:name])
        row[:head_at] ||= m[:head_at] if m
        row[:total] ||= m ? m[:messages] : row[:unacked] ? row[:ready].to_i + row[:unacked] : row[:ready]
        row
      end

      # Passive declares of 300 queues, one after another on one channel,
      # were most of the overview's time: each waits a round trip to the
      # broker. On PARALLEL channels at once those waits overlap.
      PARALLEL = 4
      PARALLEL_MIN = 25

      def counts_in_parallel(names)
        slices = names.each_slice([(names.size / PARALLEL.to_f).ceil, PARALLEL_MIN].max).to_a
        mq = connection
        return mq.queue_counts_many(names).compact if slices.size < 2

        slices.map { |slice| Thread.new { mq.queue_counts_many(slice) } }.map(&:value).reduce({}, :merge).compact
      end

      # What waits in the delay cascade: 28 passive declares, a fifth of
      # the overview's time, for numbers that change by the second at
      # most. Asked in the background at most every DELAYED_EVERY seconds;
      # the overview shows the last answer.
      DELAYED_EVERY = 5

      def delayed_levels
        @ctl_lock.synchronize do
          stale = @delayed_at.nil? || now - @delayed_at > DELAYED_EVERY
          if stale && !@delayed_thread&.alive?
            mq = connection
            @delayed_thread = Thread.new do
              value = begin
                mq.delayed.map(&:to_h)
              rescue AMQP::Error => e
                { error: "#{e.class}: #{e.message}" }
              end
              @ctl_lock.synchronize do
                @delayed = value
                @delayed_at = now
              end
            end
          end
        end
        # The first time, wait for it: the page has nothing else to show.
        @delayed_thread&.join(2) if @delayed.nil?
        @delayed || []
      end

      # While this process reads a DLQ, the overview shows the count taken
      # before the read: the messages it holds are not ready, and a passive
      # declare counts only those.
      def reading(queue)
        dlq = "#{queue}.dlq"
        before = begin
          connection.queue_counts(dlq)&.dig(:ready)
        rescue AMQP::Error
          nil
        end
        @lock.synchronize { @reading[dlq] = before } if before
        yield
      ensure
        @lock.synchronize { @reading.delete(dlq) } if before
      end

      # The overview without the broker: each queue unknown, the reason, and
      # what needs no broker (the outbox; the runners are added after).
      def down_snapshot(error)
        status = Status.new(connection: nil, targets: [], outbox: outbox, interval: 0)
        reason = error.is_a?(BrokerDown) ? error.message : "broker unreachable at #{shown_url}: #{error.class.name.split('::').last}: #{error.message}"
        { at: Time.now.utc.iso8601, broker_error: reason,
          consumers: targets.map do |t|
            { name: t.name, queue: { name: t.queue, exists: false, unknown: true }, rungs: [],
              dlq: { name: t.dlq, exists: false, unknown: true } }
          end,
          outbox: status.send(:outbox), delayed: [] }
      end

      def url
        @config.url || (defined?(AceMQ::Rails) && AceMQ::Rails.respond_to?(:config) && AceMQ::Rails.config.url) ||
          ENV.fetch("AMQP_URL", "amqp://guest:guest@localhost:5672")
      end

      # A queue's samples from before this process had any, from the
      # broker's own (the management API keeps ten minutes at 5 s): its
      # ready count and its DLQ's total, so the chart has its history after
      # the dashboard restarts. Once a queue, when its page is first drawn. The handled
      # rate, which is the runner's counter, starts with the live samples.
      # Without an answer, the live samples start as before.
      def seed(target)
        history = management.history(target.queue)
        dlq = begin
          management.history(target.dlq)[:messages].to_h
        rescue Management::Unavailable
          {} # no DLQ yet
        end
        offset = now - Time.now.to_f
        seeded = history[:ready].filter_map do |at, ready|
          Sample.new(at: at + offset, ready: ready, done: nil, dlq: dlq[at]) if at + offset >= now - KEEP
        end
        @lock.synchronize do
          kept = @samples[target.queue]
          before = kept.first&.at
          @samples[target.queue] = seeded.select { |x| before.nil? || x.at < before } + kept
          @seeded[target.queue] = true
        end
      rescue Management::Unavailable
        nil
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
        code, text = Control.new(base, token: nil, timeout: RUNNER_TIMEOUT).call(:get, "/status")
        body = JSON.parse(text)
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
        { url: base, ok: code == 200, state: body["state"], quiet: body["quiet"],
          processes: processes }
      rescue Control::Unreachable, Control::InvalidURL, JSON::ParserError => e
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
      # rabbitmqctl: true runs "rabbitmqctl" (when the broker is on this
      # machine), a String or Array names the command.
      def unacked_listing
        return nil unless @config.rabbitmqctl

        @ctl_lock.synchronize do
          stale = @ctl_at.nil? || Process.clock_gettime(Process::CLOCK_MONOTONIC) - @ctl_at > 5
          if stale && !@ctl_thread&.alive?
            command = @config.rabbitmqctl == true ? ["rabbitmqctl"] : Array(@config.rabbitmqctl).flat_map { |c| c.to_s.split }
            ctl = Status::Rabbitmqctl.new(command, vhost: vhost)
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
