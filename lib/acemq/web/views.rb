# frozen_string_literal: true

require "erb"
require "json"
require "time"
require "acemq/web/store_pages"
require "acemq/web/router"
require "acemq/web/actions"
require "acemq/web/helpers"
require "acemq/web/charts"

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
    #
    # The pages and how they are rendered are here; which page a request is
    # (Router), what a POST changes (Actions), what templates print with
    # (Helpers) and the queue's chart (Charts) are modules of their own,
    # included as StorePages is.
    class Views
      include ERB::Util
      include StorePages
      include Router
      include Actions
      include Helpers
      include Charts

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

      private

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
