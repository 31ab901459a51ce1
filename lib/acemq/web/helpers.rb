# frozen_string_literal: true

module AceMQ
  class Web
    # What the templates print with: links, numbers, times, bodies and
    # headers, each escaped or SafeHTML. Included in Views.
    module Helpers
      def link(path, params = nil)
        query = params&.reject { |_, v| v.nil? || v.to_s.empty? }
        "#{@req.base}#{path}#{query && !query.empty? ? "?#{URI.encode_www_form(query)}" : ''}"
      end

      def qpath(queue, rest = "") = "/queues/#{url_encode(queue)}#{rest}"

      # Text escaped once, as SafeHTML (already SafeHTML: as it is).
      def h(value) = Views.escape(value)

      # Markup printed as it is: only for text that is markup, built here.
      def raw(markup) = Views::SafeHTML.new(Views.text(markup))

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

      private

      # "Select all on this page": a box that ticks or clears every dead
      # letter's box in its form, drawn only where there are actions. The
      # layout adds its few lines of JavaScript after the page's main part
      # (where a page's own content never has a script); without them the
      # box does nothing, and "Replay all matching" is there.
      def select_all
        @select_all = true
        raw(%(<label><input type="checkbox" class="select-all" id="select-all"> Select all on this page</label>))
      end
    end
  end
end
