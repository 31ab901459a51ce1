# frozen_string_literal: true

require "time"

module AceMQ
  class Web
    # The DLQ pages in store mode (docs/web.md, "Store mode"): with a
    # dead-letter store configured they read its table, not the queue. Every
    # rule (the filters, the keyset pages, the snapshot a replay takes, the
    # audit rows) is the store's, core's acemq::dead_letters, which Rust
    # services share; this turns a request into one store call and its
    # answer into a page. Included in Views.
    module StorePages
      # The store page's parameters: the filters, and the cursor.
      STORE_FILTERS = %w[reason error_class type id since before].freeze
      PAGE_PARAMS = (STORE_FILTERS + %w[after_id]).freeze
      # What an action's form may carry besides the filters.
      ACTION_PARAMS = (STORE_FILTERS + %w[_csrf confirmed scope ids one all]).freeze
      AUDIT_LIMIT = 50
      AUDIT_MAX = 1_000
      # The most groups one counts call returns (the store's own bound).
      STORE_TOP = 1_000
      # The DLQ page's groups by reason and by error class: the largest
      # GROUPS_TOP asked, the first GROUPS_SHOWN drawn and the rest folded,
      # so the rows stay near the top of the page.
      GROUPS_TOP = 20
      GROUPS_SHOWN = 5
      # A replay that would take longer than this many seconds at its rate
      # runs in the background, not in the request.
      BACKGROUND_AFTER = 5

      # A request the store pages cannot read: a 400 page saying what.
      class BadRequest < StandardError; end

      def store = @source.dead_letter_store

      def store_route(path)
        if @req.get?
          return audit_page if path == "/audit"
          return audit_json if path == "/api/audit"
          if (m = %r{\A/queues/([^/]+)/dlq/letters/([^/]+)\z}.match(path))
            return with_queue(m[1]) { |t| store_letter_page(t, m[2]) }
          end
        end
        nil
      end

      # ---- pages

      def store_dlq_page(target)
        @target = target
        @title = target.dlq
        @filter = store_filter_params(PAGE_PARAMS)
        after = @req.params["after_id"].to_s
        @after_id = after.empty? ? nil : row_id("after_id", after)
        size = Integer(@source.config.page_size || 25).clamp(1, 1_000)
        query = store_query(@filter)
        t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        @page = store.list(queue: target.queue, after_id: @after_id, limit: size, **query)
        @store_counts = store.counts(queue: target.queue, top: GROUPS_TOP, **query)
        @ms = ((Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0) * 1000).round(1)
        @letters = @page.letters.map { |l| store_letter_view(l) }
        @waiting = waiting_in(target)
        page(:store_dlq)
      end

      def store_letter_page(target, raw_id)
        @target = target
        id = row_id("id", URI.decode_www_form_component(raw_id))
        letter = store.find(id)
        unless letter && letter.queue == target.queue
          return refuse(404, "No such dead letter", "#{target.queue} has no dead letter #{id} in the store: replayed, " \
                                                    "discarded, purged or pruned since, or never there.")
        end

        @letter = store_letter_view(letter)
        @title = "Dead letter #{id}"
        page(:store_letter)
      end

      def audit_page
        @title = "Audit"
        @limit = audit_limit
        @audit = store.audit(limit: @limit)
        @replays = @source.replays
        page(:audit)
      end

      # GET /api/audit?limit=N: the newest N audit rows as JSON (at as ISO
      # 8601 too). Sent as application/json with nosniff: never HTML.
      def audit_json
        rows = store.audit(limit: audit_limit).map do |a|
          a.merge(at_iso8601: Time.at(a[:at]).utc.iso8601)
        end
        # <, > and & escaped as in the page's script JSON: the same JSON,
        # and nothing in it reads as markup if it is ever shown as HTML.
        [200, headers("application/json"), [Views.script_json({ audit: rows })]]
      end

      # The overview's DLQ column in store mode: each queue's rows in the
      # store, from one grouped counts call for every queue (not one a
      # queue), beside what still waits in its DLQ. The store down is said
      # on the page, and the rest of the overview stands.
      def store_totals(snap)
        return unless @source.store_configured?

        by_queue = begin
          store.counts(top: STORE_TOP)[:by_queue]
        rescue Source::StoreUnavailable, AMQP::StoreError => e
          snap[:store_error] = e.message
          nil
        end
        # Past STORE_TOP queues with rows, a queue left out is unknown, not 0.
        complete = by_queue && by_queue.size < STORE_TOP
        snap[:consumers].each do |c|
          name = c[:queue][:name]
          c[:dlq][:stored] = by_queue&.key?(name) ? by_queue[name] : complete ? 0 : nil
        end
      end

      # What waits in a DLQ not yet ingested, for the overview: "" for none.
      def dlq_waiting_text(dlq)
        n = dlq[:total]
        n.to_i.positive? ? "+#{num(n)} waiting" : ""
      end

      # ---- actions

      # Replay the selected or all matching (the filter's snapshot is the
      # store's, taken when the confirmed form arrives), discard the
      # selected, purge the matching (with no filter only when the form says
      # all=yes): each confirmed first, each audited with the actor.
      def store_act(target, action)
        refused = refusal
        return refused if refused

        @target = target
        @action = action
        @filter = store_filter_params(ACTION_PARAMS)
        @ids = store_selected_ids
        @scope = @ids.any? ? :ids : :filter
        @all = @req.params["all"] == "yes"
        unselected = nothing_selected(action)
        return unselected if unselected
        if action == "purge" && @filter.empty? && !@all
          return refuse(400, "Purge needs a filter or all",
                        "A purge with no filter discards every dead letter of #{target.queue} in the store: the form must say " \
                        "all=yes (the page's Purge all button does), or give a filter. Nothing was changed.")
        end

        @query = store_query(@filter)
        @title = "Confirm"
        unless @req.params["confirmed"] == "yes"
          @matching = @scope == :filter ? store.counts(queue: target.queue, top: 1, **@query)[:total] : nil
          return page(:store_confirm)
        end

        @done = store_perform
        @title = "Done"
        page(:done)
      end

      def store_perform
        q = @target.queue
        who = actor
        case @action
        when "replay"
          mine, gone = own_ids(@ids)
          background = background_replay(q, who, mine)
          return background if background

          r = if @scope == :ids
                mine.empty? ? { replayed: 0, selected: 0, skipped: 0 } : store.replay(@source.connection, ids: mine, actor: who, rate: replay_rate)
              else
                store.replay(@source.connection, queue: q, actor: who, rate: replay_rate, **@query)
              end
          skipped = r[:skipped].to_i + gone
          "Replayed #{plural(r[:replayed], 'dead letter')} of #{q} from the store to #{q}" \
            "#{skipped.positive? ? "; #{plural(skipped, 'other')} selected no longer there (replayed, discarded or being replayed by another)" : ''}" \
            ". One that fails again comes back as a new row, its history showing this replay#{r[:id] ? " (#{r[:id]})" : ''}."
        when "discard"
          mine, gone = own_ids(@ids)
          n = mine.empty? ? 0 : store.discard(mine, actor: who)
          missing = gone + mine.size - n
          "Discarded #{plural(n, 'dead letter')} of #{q} from the store" \
            "#{missing.positive? ? "; #{plural(missing, 'selected one')} no longer there or being replayed" : ''}."
        when "purge"
          n = store.purge(queue: q, actor: who, **@query)
          "Purged #{plural(n, 'dead letter')} of #{q} from the store#{@filter.empty? ? ' (all of them)' : " matching #{filter_text(@filter)}"}."
        end
      end

      # ---- helpers the templates use

      def store_mode? = !store.nil?

      def filter_text(filter) = filter.map { |k, v| "#{k.tr('_', ' ')} #{v.inspect}" }.join(", ")

      # [drawn, folded, whether the store cut the list at GROUPS_TOP].
      def split_groups(groups)
        list = groups.to_a
        [list.first(GROUPS_SHOWN), list.drop(GROUPS_SHOWN), list.size >= GROUPS_TOP]
      end

      def letter_path(queue, id) = qpath(queue, "/dlq/letters/#{id}")

      # An audit row's detail (what was asked: ids, a filter, a replay's id
      # and rate) as its JSON.
      def detail_text(detail) = Source.text_of(detail)

      def utf8?(bytes) = bytes.dup.force_encoding(Encoding::UTF_8).valid_encoding?

      # Every header (or property) as JSON, x-acemq-history among them as
      # it came; what JSON cannot say, inspected.
      def json_text(value)
        JSON.pretty_generate(value.is_a?(Hash) ? value : {})
      rescue JSON::JSONError, EncodingError, SystemStackError
        value.inspect
      end

      # Who asked: c.actor's answer for this request (a callable given the
      # Rack env), else the default: REMOTE_USER (Rack::Auth::Basic and most
      # proxies set it), else "web". A blank answer falls back the same way.
      def actor
        given = @source.config.actor
        who = given.respond_to?(:call) ? given.call(@req.env) : given
        who = who.to_s.strip
        who = @req.env["REMOTE_USER"].to_s.strip if who.empty?
        who = "web" if who.empty?
        Views.text(who)[0, 200]
      end

      private

      def replay_rate
        rate = @source.config.replay_rate
        rate.nil? ? nil : Float(rate)
      end

      # A replay that would keep the page waiting longer than
      # BACKGROUND_AFTER seconds at its rate runs in the background (a
      # proxy gives up on a request long before a paced replay of
      # thousands ends); what it says, or nil to replay in the request.
      # Its snapshot is still the store's, taken as it starts.
      def background_replay(queue, who, mine)
        rate = replay_rate || AMQP::SQLDeadLetterStore::DEFAULT_REPLAY_RATE
        selected = @scope == :ids ? mine.size : store.counts(queue: queue, top: 1, **@query)[:total]
        return nil if selected.zero? || selected / rate <= BACKGROUND_AFTER

        args = @scope == :ids ? { ids: mine } : { queue: queue, **@query }
        @source.replay_in_background(queue: queue, actor: who, selected: selected, rate: rate) do |mq|
          store.replay(mq, actor: who, rate: rate, **args)
        end
        "Replaying #{plural(selected, 'dead letter')} of #{queue} from the store to #{queue} in the background, " \
          "#{num(rate.round)} a second: about #{duration_text(selected / rate)}. The audit page shows it while it runs " \
          "and records it when it ends. One that fails again comes back as a new row, its history showing this replay."
      end

      def duration_text(seconds)
        seconds < 120 ? "#{seconds.ceil} s" : "#{(seconds / 60).ceil} min"
      end

      # What waits in the DLQ itself (not yet ingested), and whether an
      # ingester consumes it (in store mode nothing else does): one passive
      # declare, or the management listing. The page renders without the
      # broker, saying so.
      def waiting_in(target)
        c = @source.counts(target.dlq)
        c ? { ready: c[:ready], consumers: c[:consumers] } : { missing: true }
      rescue Source::BrokerDown, AMQP::Error => e
        { error: e.message }
      end

      # The selected row ids that are this queue's; [ids, how many are not
      # (gone, or another queue's)].
      def own_ids(ids)
        mine = ids.select { |id| store.find(id)&.queue == @target.queue }
        [mine, ids.size - mine.size]
      end

      def store_letter_view(letter)
        history = letter.history.nil? ? {} : { "x-acemq-history" => letter.history }
        r = Source.readable(headers: history)
        _, failed_text = Source.time_of(letter.headers.is_a?(Hash) ? letter.headers["x-acemq-failed-at"] : nil)
        { id: letter.id, message_id: letter.message_id, type: letter.type, reason: letter.reason,
          error_class: letter.error_class, attempt: letter.attempt, exchange: letter.exchange,
          routing_key: letter.routing_key, failed_at: Time.at(letter.failed_at), failed_at_text: failed_text,
          ingested_at: Time.at(letter.ingested_at), history: r[:history], backtrace: letter.backtrace,
          headers: letter.headers.is_a?(Hash) ? letter.headers : {}, properties: letter.properties, body: letter.body }
      end

      # The filter fields given, as written (for the form and the links),
      # after checking every parameter is one this page knows and is text.
      def store_filter_params(allowed)
        @req.params.each do |k, v|
          text = [k, *Array(v)]
          if text.any? { |s| !s.dup.force_encoding(Encoding::UTF_8).valid_encoding? || s.include?("\0") }
            raise BadRequest, "a parameter holds bytes that are not UTF-8 text (or a NUL): nothing was read or changed"
          end
          next if allowed.include?(k)

          raise BadRequest, "unknown parameter #{Views.text(k)[0, 60].inspect}: this page takes " \
                            "#{allowed.reject { _1.start_with?('_') }.join(', ')}"
        end
        single_values!(STORE_FILTERS + %w[after_id scope confirmed all one])
        STORE_FILTERS.to_h { |k| [k, @req.params[k].to_s.strip] }.reject { |_, v| v.empty? }
      end

      # The store's keywords for a filter: since/before read as times.
      def store_query(filter)
        filter.to_h do |k, v|
          %w[since before].include?(k) ? [k.to_sym, time_param(k, v)] : [k.to_sym, v.dup.force_encoding(Encoding::UTF_8)]
        end
      end

      # A time as a form gives it: 2026-12-07T11:20 (a datetime-local
      # field, read as UTC), with seconds, a date alone, or ISO 8601 with
      # its zone.
      def time_param(name, value)
        if (m = value.match(/\A(\d{4})-(\d\d)-(\d\d)(?:[T ](\d\d):(\d\d)(?::(\d\d))?)?\z/))
          parts = m.captures.map(&:to_i)
          t = Time.utc(*parts)
          # Time.utc rolls 2026-02-30 over to March 2: a day that does
          # not exist is no time.
          raise ArgumentError, "no such day" unless [t.year, t.month, t.day] == parts.first(3)

          return t
        end

        Time.iso8601(value)
      rescue ArgumentError
        raise BadRequest, "#{name}: #{value[0, 60].inspect} is not a time: write 2026-12-07T11:20 (UTC) or an ISO 8601 " \
                          "time with its zone"
      end

      def row_id(name, value)
        n = Integer(value.to_s, 10, exception: false)
        raise BadRequest, "#{name}: #{Views.text(value)[0, 60].inspect} is not a row id (a whole number)" unless n&.between?(1, 2**63 - 1)

        n
      end

      def store_selected_ids
        one = @req.params["one"]
        list = one.is_a?(String) && !one.empty? ? [one] : Array(@req.params["ids"]).reject { |s| s.to_s.empty? }
        list.map { |v| row_id("ids", v) }.uniq
      end

      def audit_limit
        given = @req.params["limit"].to_s
        return AUDIT_LIMIT if given.empty?

        n = Integer(given, 10, exception: false)
        raise BadRequest, "limit: #{given[0, 40].inspect} is not a number from 1 to #{AUDIT_MAX}" unless n&.between?(1, AUDIT_MAX)

        n
      end
    end
  end
end
