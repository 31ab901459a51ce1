# frozen_string_literal: true

module AceMQ
  class Web
    # What a POST changes: the queue's DLQ actions, confirmed first (a page
    # of its own, no script needed), then done and said what was done; and
    # a runner's pause and resume. The store's actions are StorePages'.
    # Included in Views.
    module Actions
      ACTIONS = %w[replay discard purge].freeze

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
          missing = @scope == :ids ? @ids.size - r.replayed : 0
          "Replayed #{plural(r.replayed, 'dead letter')} from #{@target.dlq} to #{q}" \
            "#{missing.positive? ? "; #{plural(missing, 'selected one')} no longer in the DLQ" : ''}" \
            "; #{plural(r.skipped, 'other')} left in the DLQ."
        when "discard"
          r = @source.discard(q, ids: @ids)
          missing = @ids.size - r.discarded
          "Discarded #{plural(r.discarded, 'dead letter')} from #{@target.dlq}" \
            "#{missing.positive? ? "; #{plural(missing, 'selected one')} no longer in the DLQ" : ''}."
        when "purge"
          r = @source.purge(q)
          "Purged #{@target.dlq}: #{plural(r.discarded, 'dead letter')} discarded."
        end
      end

      private

      def selected_ids
        one = @req.params["one"].to_s
        return [one] unless one.empty?

        Array(@req.params["ids"]).map(&:to_s).reject(&:empty?).uniq
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
    end
  end
end
