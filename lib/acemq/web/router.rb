# frozen_string_literal: true

module AceMQ
  class Web
    # Which page a request is: by method and path, the store's pages first
    # when there is a dead-letter store. Included in Views.
    module Router
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

      private

      def with_queue(raw)
        name = URI.decode_www_form_component(raw)
        target = @source.target(name)
        return refuse(404, "No such queue", "#{name} is not one of this dashboard's queues.") unless target

        yield target
      end
    end
  end
end
