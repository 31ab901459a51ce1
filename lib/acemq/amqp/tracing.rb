# frozen_string_literal: true

module AceMQ
  module AMQP
    # W3C trace context (traceparent, tracestate) on AceMQ messages.
    #
    # The headers are ordinary headers: the engine carries them unchanged
    # through every retry rung, the DLQ, a replay and the outbox, whether or
    # not anything here runs. What this module adds, when the OpenTelemetry
    # API is loaded (the opentelemetry-api gem, configured by the SDK), is
    # the two ends of the trace: a publish injects the current context, and
    # a handler runs inside the context its message carries, in a consumer
    # span linked to the producer's. Without OpenTelemetry every method here
    # is a pass-through.
    #
    # The OpenTelemetry calls made, and nothing else (docs/tracing.md):
    # OpenTelemetry.propagation.inject / .extract, OpenTelemetry.tracer_provider.tracer,
    # Tracer#in_span(name, attributes:, links:, kind:), Span#set_attribute,
    # OpenTelemetry::Trace.current_span(context).context.valid?,
    # OpenTelemetry::Trace::Link.new and OpenTelemetry::Context.with_current.
    module Tracing
      TRACEPARENT = "traceparent"
      TRACESTATE = "tracestate"

      class << self
        # The OpenTelemetry module when it is loaded and has a propagator,
        # else nil. Looked up on every call: the SDK may be configured after
        # AceMQ is loaded (a Rails initializer), and a check of a constant is
        # the whole cost when it is not.
        def otel
          return nil unless defined?(::OpenTelemetry) && ::OpenTelemetry.respond_to?(:propagation)

          ::OpenTelemetry
        end

        def enabled? = !otel.nil?

        # The current trace context as headers (traceparent, tracestate) for
        # the engine to add to a publish that carries none, or nil without
        # OpenTelemetry (or outside any trace).
        def context
          ot = otel
          return nil if ot.nil?

          carrier = {}
          ot.propagation.inject(carrier)
          carrier.empty? ? nil : carrier.transform_keys(&:to_s)
        end

        # Run the block in a producer span for a publish to exchange with
        # routing_key; the block's injection then names this span as the
        # parent. The block gets the span (nil without OpenTelemetry).
        def publish(exchange, routing_key)
          ot = otel
          return yield(nil) if ot.nil?

          destination = exchange.to_s.empty? ? "amq.default" : exchange.to_s
          attributes = { "messaging.system" => "rabbitmq", "messaging.operation.type" => "publish",
                         "messaging.operation.name" => "publish", "messaging.destination.name" => exchange.to_s,
                         "messaging.rabbitmq.destination.routing_key" => routing_key.to_s }
          tracer(ot).in_span("publish #{destination}", attributes: attributes, kind: :producer) { |span| yield(span) }
        end

        # Run the block (the handler) for message from queue inside the
        # context the message carries, in a consumer span that is its child
        # and is linked to it.
        def process(message, queue)
          ot = otel
          return yield(nil) if ot.nil?

          context = ot.propagation.extract(message.headers)
          producer = ::OpenTelemetry::Trace.current_span(context).context
          links = producer.valid? ? [::OpenTelemetry::Trace::Link.new(producer)] : nil
          ::OpenTelemetry::Context.with_current(context) do
            tracer(ot).in_span("process #{queue}", attributes: process_attributes(message, queue), links: links,
                                                   kind: :consumer) { |span| yield(span) }
          end
        end

        # A batch of messages (a call_many handler) in one consumer span,
        # linked to each message's producer; no single one is its parent.
        def process_many(messages, queue)
          ot = otel
          return yield(nil) if ot.nil?

          links = messages.filter_map do |m|
            producer = ::OpenTelemetry::Trace.current_span(ot.propagation.extract(m.headers)).context
            ::OpenTelemetry::Trace::Link.new(producer) if producer.valid?
          end
          attributes = { "messaging.system" => "rabbitmq", "messaging.operation.type" => "process",
                         "messaging.operation.name" => "process", "messaging.batch.message_count" => messages.size,
                         "acemq.queue" => queue.to_s }
          tracer(ot).in_span("process #{queue}", attributes: attributes, links: links, kind: :consumer) { |s| yield(s) }
        end

        # What a handler's result says on its span.
        def outcome(span, result)
          return if span.nil?

          case result
          when Ack then span.set_attribute("acemq.outcome", result.kind.to_s)
          when StandardError
            span.set_attribute("acemq.outcome", result.is_a?(FatalError) ? "reject" : "retry")
            span.set_attribute("error.type", result.class.name.to_s)
          else span.set_attribute("acemq.outcome", "reject") # not an Ack: the engine rejects it
          end
        end

        private

        def tracer(ot) = ot.tracer_provider.tracer("acemq", AceMQ::VERSION)

        def process_attributes(message, queue)
          d = message.delivery
          { "messaging.system" => "rabbitmq", "messaging.operation.type" => "process",
            "messaging.operation.name" => "process", "messaging.destination.name" => d&.exchange.to_s,
            "messaging.rabbitmq.destination.routing_key" => d&.routing_key.to_s,
            "messaging.message.id" => message.id.to_s, "acemq.queue" => queue.to_s, "acemq.attempt" => message.attempt }
        end
      end
    end
  end
end
