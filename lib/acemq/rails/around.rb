# frozen_string_literal: true

module AceMQ
  module Rails
    # A handler as the Proc a subscription takes, with every call wrapped
    # (the Rails executor) when around: is given. It answers call_many only
    # when the handler underneath does, because that is how a subscription
    # decides to batch.
    module Around
      def self.wrap(handler, around = nil)
        return handler if around.nil? && handler.is_a?(Proc)

        around ||= ->(&blk) { blk.call }
        wrapped = proc { |message| around.call { handler.call(message) } }
        if handler.respond_to?(:call_many)
          wrapped.define_singleton_method(:call_many) { |messages| around.call { handler.call_many(messages) } }
        end
        if handler.respond_to?(:claim_timeout) # the deadline's bound (Connection#consume)
          wrapped.define_singleton_method(:claim_timeout) { handler.claim_timeout }
        end
        wrapped
      end
    end
  end
end
