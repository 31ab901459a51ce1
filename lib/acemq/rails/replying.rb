# frozen_string_literal: true

module AceMQ
  module Rails
    # The request a consumer's handler is handling, for Consumer#reply: set
    # on the handler's thread around each call (Consumer.pipeline), so that
    # `reply(payload)` needs no message passed in. A thread's own, because
    # the runner keeps one instance of a consumer class for all its threads.
    module Replying
      KEY = :acemq_rails_request

      def self.to(message)
        previous = Thread.current[KEY]
        Thread.current[KEY] = message
        yield
      ensure
        Thread.current[KEY] = previous
      end

      def self.current = Thread.current[KEY]

      # `instance` as the subscription calls it, the message known meanwhile.
      def self.wrap(instance) = ->(message) { to(message) { instance.call(message) } }
    end
  end
end
