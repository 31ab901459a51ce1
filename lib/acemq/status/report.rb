# frozen_string_literal: true

module AceMQ
  class Status
    # The snapshot as text for a terminal: no line wider than WIDTH (an
    # 80-column terminal, a pager, a chat paste), long names cut with an
    # ellipsis rather than wrapped, so the columns stay columns.
    module Report
      WIDTH = 80
      NAME = 34
      DASH = "—"
      HEADER = format("  %-#{NAME}s %5s %7s %4s %8s %7s", "QUEUE", "READY", "UNACKED", "CONS", "CHANGE/S", "DONE/S")

      def self.render(snapshot)
        lines = ["acemq status  #{snapshot[:broker]}  #{snapshot[:at]}"]
        lines << if snapshot[:unacked_from]
                   "unacked: from #{snapshot[:unacked_from]}"
                 else
                   "unacked: #{DASH} (#{snapshot[:unacked_error] || 'no rabbitmqctl for this broker'})"
                 end
        lines << if snapshot[:metrics_error] && snapshot[:metrics_url]
                   "no runner metrics at #{snapshot[:metrics_url]} (#{snapshot[:metrics_error]})"
                 elsif snapshot[:metrics_error]
                   "no runner metrics: #{snapshot[:metrics_error]}"
                 else
                   "runner metrics: #{snapshot[:metrics_url]}"
                 end
        lines << "sampled over #{snapshot[:interval]}s"
        snapshot[:consumers].each { |c| lines.concat(consumer(c)) }
        lines << ""
        lines << outbox(snapshot[:outbox])
        lines << delayed(snapshot[:delayed]) if snapshot.key?(:delayed)
        lines.map { |l| fit(l) }.join("\n")
      end

      def self.consumer(c)
        flow = [("paused" if c[:queue][:paused]), ("circuit open" if c[:queue][:circuit_open])].compact
        title = c[:name] ? "#{c[:name]} (#{c[:queue][:name]})" : c[:queue][:name]
        out = ["", flow.empty? ? title : "#{title}: #{flow.join(', ')}", HEADER]
        out << queue_row(c[:queue], change: true)
        c[:rungs].each { |r| out << queue_row(r) if r[:exists] }
        out << queue_row(c[:dlq])
        q = c[:queue]
        if q.key?(:duplicates_per_s)
          ratio = q[:duplicate_ratio] ? format(" (%.1f%% of done)", q[:duplicate_ratio] * 100) : ""
          out << "  duplicates #{q[:duplicates_per_s]}/s#{ratio}"
        end
        unless c[:dlq][:newest].to_a.empty?
          out << "  dead letters, newest first:"
          c[:dlq][:newest].each do |d|
            at = d[:failed_at] ? d[:failed_at].sub(/\A\d{4}-\d\d-\d\dT/, "") : "?"
            # The reason is the point of the line; the id and the type are
            # in --json and in acemq:dlq:peek.
            out << "    #{at} attempt #{d[:attempt]}: #{d[:reason]}" \
                   "#{d[:error_class] ? " (#{d[:error_class]})" : ''}"
          end
        end
        out
      end

      def self.queue_row(r, change: false)
        return format("  %-#{NAME}s %s", cut(r[:name], NAME), "missing") unless r[:exists]

        change = change && r[:ready_change_per_s] ? format("%+.1f", r[:ready_change_per_s]) : ""
        done = r[:done_per_s] ? format("%.1f", r[:done_per_s]) : ""
        format("  %-#{NAME}s %5s %7s %4s %8s %7s", cut(r[:name], NAME), r[:ready], r[:unacked] || DASH,
               r[:consumers], change, done).rstrip
      end

      def self.outbox(o)
        return "outbox: none configured" unless o
        return "outbox: #{o[:error]}" if o[:error]

        age = o[:oldest_age] ? "#{o[:oldest_age]}s" : DASH
        "outbox #{o[:table]}: #{o[:waiting]} waiting, oldest #{age}, #{o[:failing]} failing"
      end

      # The delay cascade: how many wait, and in which levels (a level holds
      # a message 2^level seconds).
      def self.delayed(d)
        return "delayed: #{d[:error]}" if d.is_a?(Hash)
        return "delayed: none waiting" if d.empty?

        total = d.sum { |l| l[:waiting] }
        "delayed: #{total} waiting (#{d.map { |l| "#{l[:seconds]}s: #{l[:waiting]}" }.join(', ')})"
      end

      def self.cut(text, width)
        text = text.to_s
        text.size > width ? "#{text[0, width - 1]}…" : text
      end

      def self.fit(line) = cut(line, WIDTH)
    end

    def self.render(snapshot) = Report.render(snapshot)
  end
end
