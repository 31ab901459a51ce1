# frozen_string_literal: true

require "acemq/amqp/patterns"
require_relative "../fixtures/open_telemetry_stand_in"

# Trace context in Ruby, on memory://: headers pass through untouched
# without OpenTelemetry; with it (here the stand-in of
# spec/fixtures/open_telemetry_stand_in.rb, not the SDK) a publish injects
# the current context and a handler runs inside the context its message
# carries, in a consumer span linked to the producer's.
RSpec.describe "tracing" do
  let(:tp) { "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" }

  let(:mq) { AceMQ::AMQP::Connection.open(memory_url) }
  let(:queue) { unique("traced") }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
  after { mq.close }

  # Consume one message, running block in the handler; returns what it returned.
  def handled(&block)
    seen = Queue.new
    sub = mq.consume(queue) do |m|
      seen << block.call(m)
      AceMQ::AMQP::Ack.accept
    end
    eventually { seen.pop(true) rescue nil }
  ensure
    sub&.cancel
  end

  context "without OpenTelemetry" do
    it "passes traceparent and tracestate through untouched, and adds none" do
      expect(AceMQ::AMQP::Tracing.enabled?).to be(false)
      mq.publish({ "n" => 1 }, to: queue, headers: { "traceparent" => tp, "tracestate" => "congo=t61rcWkgMzE" })
      expect(handled(&:headers)).to include("traceparent" => tp, "tracestate" => "congo=t61rcWkgMzE")
      mq.publish({ "n" => 2 }, to: queue)
      expect(handled(&:headers)).not_to include("traceparent")
    end
  end

  context "with OpenTelemetry (a stand-in of its API)" do
    around { |ex| OpenTelemetryStandIn.install { ex.run } }

    let(:otel) { OpenTelemetryStandIn }
    let(:tracer) { otel.tracer_provider.tracer("app") }

    it "injects the publish span's context, and runs the handler in a consumer span that is its child and linked to it" do
      env = tracer.in_span("POST /orders", kind: :server) { mq.publish({ "n" => 1 }, to: queue) }
      request = otel.spans.find { |s| s.name == "POST /orders" }
      publish = otel.spans.find { |s| s.name == "publish amq.default" }
      expect(publish.kind).to eq(:producer)
      expect(publish.parent.span_id).to eq(request.context.span_id)
      expect(publish.attributes).to include("messaging.system" => "rabbitmq", "messaging.operation.type" => "publish",
                                            "messaging.destination.name" => "",
                                            "messaging.rabbitmq.destination.routing_key" => queue,
                                            "messaging.message.id" => env.id)
      traceparent = "00-#{request.context.trace_id}-#{publish.context.span_id}-01"
      expect(env.headers["traceparent"]).to eq(traceparent)

      inside = handled { |m| [m.headers["traceparent"], OpenTelemetry::Trace.current_span.context] }
      expect(inside[0]).to eq(traceparent)
      process = otel.spans.find { |s| s.name == "process #{queue}" }
      expect(inside[1]).to eq(process.context), "the handler runs inside the consumer span"
      expect(process.kind).to eq(:consumer)
      expect(process.context.trace_id).to eq(request.context.trace_id)
      expect(process.parent.span_id).to eq(publish.context.span_id)
      expect(process.links.map { |l| l.span_context.span_id }).to eq([publish.context.span_id])
      expect(process.attributes).to include("messaging.system" => "rabbitmq", "messaging.operation.type" => "process",
                                            "messaging.rabbitmq.destination.routing_key" => queue,
                                            "messaging.message.id" => env.id, "acemq.queue" => queue,
                                            "acemq.attempt" => 1, "acemq.outcome" => "accept")
      expect(otel.tracer_provider.tracers).to include(["acemq", AceMQ::VERSION])
    end

    it "leaves a traceparent the caller gave as it is" do
      tracer.in_span("job") { mq.publish({}, to: queue, headers: { "traceparent" => tp }) }
      expect(handled { |m| m.headers["traceparent"] }).to eq(tp)
    end

    it "starts a trace at a publish with no current span, and adds nothing to a record made outside one" do
      env = mq.publish({}, to: queue)
      publish = otel.spans.find { |s| s.name == "publish amq.default" }
      expect(publish.parent).to be_nil
      expect(env.headers["traceparent"]).to eq("00-#{publish.context.trace_id}-#{publish.context.span_id}-01")
      handled(&:headers)
      process = otel.spans.find { |s| s.name == "process #{queue}" }
      expect(process.parent.span_id).to eq(publish.context.span_id)

      record = AceMQ::AMQP::Patterns.record(mq, {}, to: queue)
      expect(record.envelope.headers).not_to include("traceparent")
    end

    it "records a raising handler's outcome on its span" do
      mq.publish({}, to: queue)
      raised = Queue.new
      sub = mq.consume(queue, retries: { max_attempts: 1 }) do |_m|
        raised << true
        raise ArgumentError, "boom"
      end
      eventually { raised.pop(true) rescue nil }
      process = eventually { otel.spans.find { |s| s.name == "process #{queue}" } }
      sub.cancel
      expect(process.attributes).to include("acemq.outcome" => "retry", "error.type" => "ArgumentError")
    end

    it "puts the current context on an outbox record, and a batch's messages" do
      record = tracer.in_span("checkout") do
        AceMQ::AMQP::Patterns.record(mq, { "order_id" => "A-1" }, to: "order.placed", exchange: "orders-events")
      end
      checkout = otel.spans.find { |s| s.name == "checkout" }
      expect(record.envelope.headers["traceparent"]).to eq("00-#{checkout.context.trace_id}-#{checkout.context.span_id}-01")

      tracer.in_span("import") { mq.batch { |b| b.publish({ "n" => 1 }, to: queue) } }
      import = otel.spans.find { |s| s.name == "import" }
      expect(handled { |m| m.headers["traceparent"] }).to eq("00-#{import.context.trace_id}-#{import.context.span_id}-01")
    end
  end
end
