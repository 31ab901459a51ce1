# frozen_string_literal: true

module AceMQ
  module AMQP
    module Patterns
      # A middleware is an object answering call(message, app), where app is
      # the rest of the pipeline (it answers call(message) and returns an
      # Ack). It may call app once, not at all (a duplicate), or act on what
      # it returns. Patterns.with_idempotency is one; a lambda taking two
      # arguments is one too:
      #
      #   timing = ->(message, app) { t = now; app.call(message).tap { record(now - t) } }
      #   mq.consume("payments", &Patterns.pipeline(timing, Patterns.with_idempotency(store)) { |m| charge(m) })
      #
      # Middlewares run in the order given, outermost first; the handler (the
      # last argument, or the block) is innermost and is called as it is, so
      # it keeps its own self.
      def self.pipeline(*middlewares, &block)
        handler = block || middlewares.pop
        unless handler.respond_to?(:call)
          raise ConfigurationError, "Patterns.pipeline needs a handler: a block, or a last argument answering call(message)"
        end

        middlewares.each do |m|
          next if m.respond_to?(:call)

          raise ConfigurationError, "#{m.inspect} is not a middleware: it must answer call(message, app)"
        end
        app = middlewares.reverse.reduce(handler) { |inner, m| Link.new(m, inner) }
        app.method(:call).to_proc
      end

      class << self
        alias compose pipeline
      end

      # One middleware bound to the rest of the pipeline.
      class Link
        def initialize(middleware, app)
          @middleware = middleware
          @app = app
        end

        def call(message) = @middleware.call(message, @app)
      end
      private_constant :Link
    end
  end
end
