# frozen_string_literal: true

module AceMQ
  module Rails
    # A handler as the Proc a subscription takes, with every call wrapped
    # (the Rails executor) when around: is given, and what it raises handed
    # to report: (an ErrorReport) when that is given. It answers call_many
    # only when the handler underneath does, because that is how a
    # subscription decides to batch.
    module Around
      def self.wrap(handler, around = nil, report: nil)
        return handler if around.nil? && report.nil? && handler.is_a?(Proc)

        around ||= ->(&blk) { blk.call }
        inner = report ? reporting(handler, report) : handler
        wrapped = proc { |message| around.call { inner.call(message) } }
        if handler.respond_to?(:call_many)
          wrapped.define_singleton_method(:call_many) { |messages| around.call { inner.call_many(messages) } }
        end
        if handler.respond_to?(:claim_timeout) # the deadline's bound (Connection#consume)
          wrapped.define_singleton_method(:claim_timeout) { handler.claim_timeout }
        end
        wrapped
      end

      # handler with its failures reported, then raised (or returned) as
      # before. Inside around, so that a report carries the context the
      # handler gave Rails.error, which the executor clears as it completes.
      # The exception still passes through the executor, which on Rails 7.1
      # and later reports what passes through it as unhandled, unless it
      # was reported already, as this one has been.
      def self.reporting(handler, report)
        reported = proc do |message|
          handler.call(message)
        rescue StandardError => e
          report.call(e, message)
          raise
        end
        return reported unless handler.respond_to?(:call_many)

        reported.define_singleton_method(:call_many) do |messages|
          # A batch returns the StandardError a message's handler raised as
          # that message's result; what it raises failed every message.
          handler.call_many(messages).tap do |results|
            results.each_with_index { |r, i| report.call(r, messages[i]) if r.is_a?(StandardError) }
          end
        rescue StandardError => e
          messages.each { |m| report.call(e, m) }
          raise
        end
        reported
      end
    end
  end
end
