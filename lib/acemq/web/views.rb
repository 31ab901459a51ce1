# frozen_string_literal: true

require "erb"
require "json"
require "time"
require "acemq/web/store_pages"

module AceMQ
  class Web
    # One request: the route, the data from Source, the HTML. Pages are ERB
    # templates under views/ in one layout; no JavaScript framework, no
    # asset pipeline: the CSS and the few lines of JS are inline.
    #
    # `<%= %>` escapes what it prints (Views.escape): a dead letter's headers
    # are whatever its publisher chose, and the page holds the CSRF token.
    # Markup the code builds itself is a SafeHTML (what render, h,
    # token_field, ago and chart_svg return), printed as it is; a template
    # that means to print markup says so with raw(...). So a forgotten h()
    # is a string shown with its angle brackets, never script.
    class Views
      include ERB::Util
      include StorePages

      # A String that is HTML already: markup built here, or text escaped
      # once. `<%= %>` prints it as it is (as Rails' SafeBuffer). Anything
      # made from it by String's methods (+, interpolation) is a plain
      # String again, escaped when printed: wrap such a result in raw(...)
      # only when every piece of it was markup or escaped.
      class SafeHTML < String
        def html_safe? = true
        def to_s = self
      end

      # `<%= expr %>` compiles to Views.escape(expr): escaped unless it is
      # SafeHTML.
      class Compiler < ERB::Compiler
        def add_insert_cmd(out, content)
          out.push("#{@insert_cmd}(::AceMQ::Web::Views.escape((#{content})))")
        end
      end

      # ERB with that compiler.
      class Template < ERB
        def make_compiler(trim_mode) = Compiler.new(trim_mode)
      end

      # What `<%= value %>` prints: SafeHTML as it is, anything else as text
      # (to_s, made valid UTF-8, HTML-escaped).
      def self.escape(value)
        return value if value.is_a?(SafeHTML)

        SafeHTML.new(ERB::Util.html_escape(text(value)))
      end

      # value.to_s as valid UTF-8: bytes that are not become U+FFFD (a body
      # or a header can be anything; a binary string would not join the page).
      def self.text(value)
        s = value.to_s
        return s if s.encoding == Encoding::UTF_8 && s.valid_encoding?

        s.dup.force_encoding(Encoding::UTF_8).scrub
      end

      # value as JSON that is safe inside a <script> element, marked as
      # markup: <, > and & escaped (no "</script>" or "<!--" can end or
      # change the element) and U+2028/U+2029 (line ends to older
      # JavaScript).
      def self.script_json(value)
        SafeHTML.new(JSON.generate(value).gsub(/[<>&\u2028\u2029]/) { |c| format("\\u%04x", c.ord) })
      end

      def self.compile(source) = Template.new(source, trim_mode: "-")

      def self.define_template(name)
        TEMPLATES[name.to_s].def_method(self, "template_#{name}()", File.join(DIR, "#{name}.erb"))
      end

      DIR = File.join(__dir__, "views")
      TEMPLATES = Hash.new { |h, name| h[name] = compile(File.read(File.join(DIR, "#{name}.erb"), encoding: Encoding::UTF_8)) }
      FILTERS = %w[reason type error_class id].freeze
      ACTIONS = %w[replay discard purge].freeze

      def initialize(request, source)
        @req = request
        @source = source
      end

      def respond
        unless @req.unreadable.empty?
          return bad_request("a parameter could not be read (#{Views.text(@req.unreadable.first).inspect}: a %-escape that is " \
                             "not one): nothing was read or changed")
        end

        route
      rescue StorePages::BadRequest, AMQP::ConfigurationError => e
        # A form's value the page or the store cannot take (a cursor that
        # is no number, an unknown filter, bytes that are not UTF-8): say
        # what, change nothing.
        bad_request(e.message)
      rescue Source::StoreUnavailable, AMQP::StoreError => e
        refuse(503, "Dead-letter store unavailable", "The dead-letter store did not answer: #{e.message}. Nothing was changed.")
      rescue Source::BrokerDown, AMQP::ConnectionError, AMQP::TimeoutError => e
        down(e)
      rescue AMQP::BrokerError => e
        return down(e) if Source::CONNECTION_CLOSED.include?(e.reply_code)
        raise unless Source.busy?(e)

        refuse(409, "Another operator is reading this DLQ",
               "Another operator is reading #{@target&.dlq || 'this DLQ'} (another browser or process); try again in a " \
               "moment. One reader at a time keeps the DLQ's order and every dead letter in view: nothing was changed.")
      end

      # Which part is down, and what still works: a page of its own, 503.
      def down(error)
        @title = "Broker unreachable"
        @health = @source.health(error)
        page(:down, status: 503)
      end

      def bad_request(message)
        return [400, headers("application/json"), [JSON.generate(error: Views.text(message))]] if @req.path.start_with?("/api/")

        refuse(400, "Bad request", message)
      end

      def route
        path = @req.path
        if %w[/audit /api/audit].include?(path) && !@source.store_configured?
          said = "The audit is the dead-letter store's, and this dashboard has none (docs/web.md, Store mode)."
          return [404, headers("application/json"), [JSON.generate(error: said)]] if path.start_with?("/api/")

          return refuse(404, "No dead-letter store", said)
        end
        if @source.store_configured? && (found = store_route(path))
          return found
        end
        if @req.get?
          return overview if ["/", ""].include?(path)
          return json(overview_values) if path == "/overview.json"
          if (m = %r{\A/queues/([^/]+)\z}.match(path))
            return with_queue(m[1]) { |t| queue_page(t) }
          end
          if (m = %r{\A/queues/([^/]+)/dlq\z}.match(path))
            return with_queue(m[1]) { |t| store ? store_dlq_page(t) : dlq_page(t) }
          end
        elsif @req.post? && (m = %r{\A/queues/([^/]+)/dlq/(replay|discard|purge)\z}.match(path))
          return with_queue(m[1]) { |t| store ? store_act(t, m[2]) : act(t, m[2]) }
        elsif @req.post? && (m = %r{\A/runners/(pause|resume)\z}.match(path))
          return control(m[1])
        end
        refuse(404, "Not found", "Nothing at #{path}.")
      end

      # ---- pages

      def overview
        @title = "Overview"
        @snap = @source.overview
        store_totals(@snap)
        page(:overview)
      end

      # The overview's numbers, each under the key its element carries
      # (data-k), and the runners' section as HTML: what the page's script
      # puts in place every 2 s.
      def overview_values
        @snap = @source.overview
        store_totals(@snap)
        values = {}
        @snap[:consumers].each do |c|
          q = c[:queue]
          k = "q:#{q[:name]}"
          values["#{k}:ready"] = num(q[:ready])
          values["#{k}:unacked"] = num(q[:unacked])
          values["#{k}:consumers"] = num(q[:consumers])
          values["#{k}:change"] = rate(q[:ready_change_per_s])
          values["#{k}:done"] = rate(q[:done_per_s])
          values["#{k}:rungs"] = num(rungs_ready(c))
          values["#{k}:dlq"] = num(c[:dlq].key?(:stored) ? c[:dlq][:stored] : c[:dlq][:total])
          values["#{k}:dlq-waiting"] = dlq_waiting_text(c[:dlq]) if c[:dlq].key?(:stored)
          values["#{k}:total"] = num(q[:total])
          values["#{k}:oldest"] = age(q[:head_at])
        end
        values["broker"] = @snap[:broker_error].to_s
        values["outbox"] = outbox_text(@snap[:outbox])
        values["delayed"] = delayed_text(@snap[:delayed])
        values["at"] = @snap[:at]
        { values: values, runners: render(:runners) }
      end

      def queue_page(target)
        @target = target
        @source.sample_queue(target)
        @samples = @source.samples(target.queue)
        return html(200, chart_svg) if @req.params["part"] == "chart"

        @title = target.queue
        @counts = ([target.queue] + target.rungs + [target.dlq]).to_h { |n| [n, @source.counts(n)] }
        @newest = if store
                    { store: true, dead_letters: store.list(queue: target.queue, limit: 10).letters.map { |l| store_letter_view(l) } }
                  else
                    queue_newest(target)
                  end
        page(:queue)
      end

      def queue_newest(target)
        @counts[target.dlq]&.dig(:ready).to_i.positive? ? @source.newest(target.queue, 10) : nil
      rescue AMQP::BrokerError => e
        raise unless Source.busy?(e)

        { busy: true }
      end

      def dlq_page(target)
        @target = target
        @title = "#{target.dlq}"
        @filter = filter_params
        @dlq_counts = @source.counts(target.dlq)
        unless @dlq_counts
          return refuse(404, "No DLQ", "#{target.dlq} is not declared: nothing has been dead-lettered from #{target.queue}.")
        end
        @page_no = [Integer(@req.params["page"] || 1, exception: false) || 1, 1].max
        @result = @source.browse(target.queue, page: @page_no, filter: filter_for_engine(@filter))
        page(:dlq)
      end

      # ---- actions: confirm first (a page of its own, no script needed),
      # then do it and say what was done.

      def act(target, action)
        refused = refusal
        return refused if refused

        @target = target
        @action = action
        @ids = selected_ids
        @filter = filter_params
        @scope = @ids.any? ? :ids : :filter
        unselected = nothing_selected(action)
        return unselected if unselected

        @title = "Confirm"
        return page(:confirm) unless @req.params["confirmed"] == "yes"

        @done = perform
        @title = "Done"
        page(:done)
      end

      # Pause or resume a consumer: the runner's own control request (POST
      # /consumers/NAME/pause on its health endpoint), the one mechanism
      # `acemq ctl pause` uses. Reversible, so it asks nothing first.
      def control(action)
        refused = refusal
        return refused if refused

        runner = @source.runners[Integer(@req.params["runner"].to_s, exception: false) || -1]
        name = @req.params["consumer"].to_s
        return refuse(422, "No such runner", "No runner #{@req.params['runner'].inspect} here.") if runner.nil? || name.empty?

        code, said = @source.control(runner, name, action)
        @title = code == 200 ? "Done" : "Refused by the runner"
        @message = "#{runner} answered #{code}: #{said.strip}"
        page(:message, status: code == 200 ? 200 : 502)
      end

      # Why a POST changes nothing: read-only here, or no matching CSRF token.
      def refusal
        return refuse(403, "Read-only", "This dashboard is read-only here: nothing was changed.") if @req.read_only?
        return nil if @req.csrf_ok?

        refuse(403, "Refused: CSRF token",
               "The form's CSRF token is missing or does not match this browser's: nothing was changed. " \
               "Reload the page and try again.")
      end

      def perform
        q = @target.queue
        case @action
        when "replay"
          r = @scope == :ids ? @source.replay(q, ids: @ids) : @source.replay(q, filter: filter_for_engine(@filter))
          missing = @scope == :ids ? @ids.size - r[:replayed] : 0
          "Replayed #{plural(r[:replayed], 'dead letter')} from #{@target.dlq} to #{q}" \
            "#{missing.positive? ? "; #{plural(missing, 'selected one')} no longer in the DLQ" : ''}" \
            "; #{plural(r[:skipped], 'other')} left in the DLQ."
        when "discard"
          r = @source.discard(q, ids: @ids)
          missing = @ids.size - r[:discarded]
          "Discarded #{plural(r[:discarded], 'dead letter')} from #{@target.dlq}" \
            "#{missing.positive? ? "; #{plural(missing, 'selected one')} no longer in the DLQ" : ''}."
        when "purge"
          r = @source.purge(q)
          "Purged #{@target.dlq}: #{plural(r[:discarded], 'dead letter')} discarded."
        end
      end

      # ---- helpers the templates use

      def link(path, params = nil)
        query = params&.reject { |_, v| v.nil? || v.to_s.empty? }
        "#{@req.base}#{path}#{query && !query.empty? ? "?#{URI.encode_www_form(query)}" : ''}"
      end

      def qpath(queue, rest = "") = "/queues/#{url_encode(queue)}#{rest}"

      # Text escaped once, as SafeHTML (already SafeHTML: as it is).
      def h(value) = Views.escape(value)

      # Markup printed as it is: only for text that is markup, built here.
      def raw(markup) = SafeHTML.new(Views.text(markup))

      def script_json(value) = Views.script_json(value)

      def token_field = raw(%(<input type="hidden" name="#{CSRF_FIELD}" value="#{h(@req.token)}">))

      def read_only? = @req.read_only?

      def num(value) = value.nil? ? "—" : value.to_s.reverse.scan(/\d{1,3}/).join(",").reverse.then { |s| value.negative? ? "-#{s}" : s }

      def rate(value) = value.nil? ? "—" : format("%+.1f", value).sub("+0.0", "0.0")

      def rungs_ready(consumer)
        rs = consumer[:rungs].select { |r| r[:exists] }
        rs.empty? ? nil : rs.sum { |r| r[:ready].to_i }
      end

      def outbox_text(outbox)
        return "no outbox" unless outbox
        return outbox[:error] if outbox[:error]

        age = outbox[:oldest_age] ? "oldest #{outbox[:oldest_age]} s" : "none waiting"
        "#{num(outbox[:waiting])} waiting, #{age}#{outbox[:failing].to_i.positive? ? ", #{outbox[:failing]} failing" : ''}"
      end

      # What waits in the delay cascade (docs/delays.md), as acemq status
      # says it.
      def delayed_text(delayed) = Status::Report.delayed(delayed || []).delete_prefix("delayed: ")

      # How long ago `time` was, short: "12 s", "4 min", "2.5 h"; "—" for none.
      def age(time)
        return "—" unless time

        s = [(Time.now - time).round, 0].max
        s < 90 ? "#{s} s" : s < 5400 ? "#{(s / 60.0).round} min" : "#{(s / 3600.0).round(1)} h"
      end

      def plural(n, word) = "#{num(n)} #{word}#{n == 1 ? '' : 's'}"

      def ago(time)
        return "—" unless time

        s = (Time.now - time).round
        rel = s < 90 ? "#{s} s ago" : s < 5400 ? "#{(s / 60.0).round} min ago" : "#{(s / 3600.0).round(1)} h ago"
        raw(%(<time datetime="#{time.utc.iso8601}" title="#{time.utc.iso8601}">#{rel}</time>))
      end

      # The body as JSON pretty-printed, else as text, else its size.
      def pretty_body(body)
        text = body.dup.force_encoding(Encoding::UTF_8)
        return "(#{body.bytesize} bytes, not UTF-8)" unless text.valid_encoding?

        JSON.pretty_generate(JSON.parse(text))
      rescue JSON::ParserError
        text
      end

      # The failure's backtrace (x-acemq-backtrace: frames joined by "\n",
      # at most 20 and 4 KiB as sent; whatever a publisher put there is
      # printed as text, cut at 4 KiB), or nil.
      def backtrace_of(letter)
        bt = letter[:backtrace] || letter[:headers].is_a?(Hash) && letter[:headers]["x-acemq-backtrace"]
        return nil if bt.nil? || bt == false

        text = bt.is_a?(String) ? bt : Source.text_of(bt)
        text.empty? ? nil : Views.text(text).byteslice(0, 4096).scrub
      end

      # One x-acemq-history entry, as Source.history_entry reads it, the way
      # both DLQ browsers print it: an entry that was no table as its text,
      # else its reason (error class), attempts and when, each escaped.
      def history_item(entry)
        return h(entry[:text]) if entry[:text]

        out = +""
        out << h(entry[:reason] || "—")
        out << " (" << h(entry[:error_class]) << ")" if entry[:error_class]
        out << ", " << h(entry[:attempts]) << " attempts" if entry[:attempts]
        if entry[:failed_at]
          out << ", " << ago(entry[:failed_at])
        elsif entry[:failed_at_text]
          out << ", failed at " << h(entry[:failed_at_text])
        end
        raw(out)
      end

      def pretty_headers(headers)
        JSON.pretty_generate(headers.reject { |k, _| k == "x-acemq-history" })
      rescue JSON::JSONError, EncodingError
        headers.inspect
      end

      # The kept samples as inline SVG: the rates (handled/s from the
      # runner's counter, dead-lettered/s from the DLQ's growth) and the
      # depths (ready, DLQ), each over the last minutes.
      def chart_svg
        pts = @samples
        return raw(%(<p class="muted" id="chart">No samples yet: the overview and this page take one each refresh.</p>)) if pts.size < 2

        rate = lambda do |field|
          pts.each_cons(2).map do |a, b|
            x = a.public_send(field)
            y = b.public_send(field)
            [b.at, x && y ? [(y - x) / (b.at - a.at), 0].max : nil]
          end
        end
        depth = ->(field) { pts.map { |s| [s.at, s.public_send(field)] } }
        span = [pts.last.at - pts.first.at, 1].max
        raw(%(<div id="chart">) +
          svg_chart("Rates", "/s", pts.first.at, span, "handled" => rate.call(:done), "dead-lettered" => rate.call(:dlq)) +
          svg_chart("Depth", "", pts.first.at, span, "ready" => depth.call(:ready), "in the DLQ" => depth.call(:dlq)) +
          "</div>")
      end

      def svg_chart(title, unit, t0, span, series)
        w = 600
        hgt = 100
        max = [series.values.flatten(1).filter_map(&:last).max.to_f, 1].max
        lines = series.each_with_index.map do |(name, points), i|
          xy = points.filter_map { |t, v| v && format("%.1f,%.1f", (t - t0) / span * w, hgt - (v.to_f / max * (hgt - 10))) }
          %(<polyline fill="none" stroke="#{i.zero? ? '#2563eb' : '#dc2626'}" stroke-width="2" vector-effect="non-scaling-stroke" points="#{xy.join(' ')}"><title>#{name}</title></polyline>)
        end
        names = series.keys
        <<~SVG
          <figure><svg viewBox="0 0 #{w} #{hgt}" width="100%" height="#{hgt}" preserveAspectRatio="none" role="img" aria-label="#{h(@target.queue)}: #{title.downcase}, #{names[0]} (blue) and #{names[1]} (red) over the last #{span.round} s, top #{max.round(1)}#{unit}">
          <line x1="0" y1="#{hgt}" x2="#{w}" y2="#{hgt}" stroke="#999"/>#{lines.join}</svg>
          <figcaption>#{title}: #{names[0]} (blue) and #{names[1]} (red)#{unit}, last #{span.round} s, #{@samples.size} samples, top #{max.round(1)}#{unit}.</figcaption></figure>
        SVG
      end

      private

      def with_queue(raw)
        name = URI.decode_www_form_component(raw)
        target = @source.target(name)
        return refuse(404, "No such queue", "#{name} is not one of this dashboard's queues.") unless target

        yield target
      end

      def filter_params
        single_values!(FILTERS)
        FILTERS.to_h { |k| [k, @req.params[k].to_s.strip] }.reject { |_, v| v.empty? }
      end

      # A filter takes one value (reason=…): one sent as a list
      # (reason[]=…) is refused, never read as no filter, which for
      # "replay all matching" would be all.
      def single_values!(keys)
        many = keys.find { |k| @req.params[k].is_a?(Array) }
        raise StorePages::BadRequest, "#{many} takes one value (#{many}=…), not a list: nothing was read or changed" if many
      end

      def filter_for_engine(filter)
        { reason: filter["reason"], type: filter["type"], error_class: filter["error_class"],
          ids: filter["id"] && [filter["id"]] }.compact
      end

      def selected_ids
        one = @req.params["one"].to_s
        return [one] unless one.empty?

        Array(@req.params["ids"]).map(&:to_s).reject(&:empty?).uniq
      end

      def page(name, status: 200)
        @content = render(name)
        html(status, render(:layout))
      end

      # Each template becomes a method of this class the first time it is
      # rendered: ERB#result evaluates the template's Ruby source again on
      # every call, a third of the overview's own time with 50 queues.
      def render(name)
        meth = :"template_#{name}"
        Views.define_template(name) unless Views.method_defined?(meth, false)
        SafeHTML.new(send(meth))
      end

      # "Select all on this page": a box that ticks or clears every dead
      # letter's box in its form, drawn only where there are actions. The
      # layout adds its few lines of JavaScript after the page's main part
      # (where a page's own content never has a script); without them the
      # box does nothing, and "Replay all matching" is there.
      def select_all
        @select_all = true
        raw(%(<label><input type="checkbox" class="select-all" id="select-all"> Select all on this page</label>))
      end

      # The 422 for a discard, or a replay not of all matching, with none
      # selected (the queue's DLQ page and the store's alike); nil when
      # something is.
      def nothing_selected(action)
        return nil if @ids.any?
        if action == "discard"
          return refuse(422, "Nothing selected", "Discard takes the dead letters you select: none were.")
        end
        return nil unless action == "replay" && @req.params["scope"] != "filter"

        refuse(422, "Nothing selected", "Select dead letters to replay, or replay all matching a filter.")
      end

      def refuse(status, title, message)
        @title = title
        @message = message
        page(:message, status: status)
      end

      def headers(type)
        h = { "content-type" => type, "cache-control" => "no-store", "x-frame-options" => "DENY",
              "x-content-type-options" => "nosniff", "referrer-policy" => "same-origin" }
        cookie = @req.cookie_header
        h["set-cookie"] = cookie if cookie
        h
      end

      def html(status, body) = [status, headers("text/html; charset=utf-8"), [body]]

      def json(value) = [200, headers("application/json"), [JSON.generate(value)]]
    end
  end
end
