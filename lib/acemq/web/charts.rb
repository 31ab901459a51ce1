# frozen_string_literal: true

module AceMQ
  class Web
    # The queue page's chart, inline SVG from the samples Source keeps.
    # Included in Views.
    module Charts
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
    end
  end
end
