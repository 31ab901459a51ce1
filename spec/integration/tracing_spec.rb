# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require_relative "../fixtures/open_telemetry_stand_in"

# W3C trace context on RabbitMQ, with no OpenTelemetry loaded: the headers a
# publisher set at attempt 1 arrive unchanged at attempt 3, in the DLQ copy,
# after a replay, and through the outbox on SQLite and PostgreSQL. A message
# without them, before and after, goes through as usual and gains none.
module TracingSpec
  TRACE = { "traceparent" => "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate" => "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7" }.freeze
  Ack = AceMQ::AMQP::Ack
  Patterns = AceMQ::AMQP::Patterns

  RSpec.describe "trace context through the ladder, the DLQ and a replay" do
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
    let(:queue) { unique("traced") }

    before do
      AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
      broker_names[:queues].push(queue, "#{queue}.dlq")
    end
    after { mq.close }

    it "arrives unchanged at attempt 3, in the DLQ copy and after a replay, between two good messages" do
      seen = Queue.new
      sub = mq.consume(queue, retries: { max_attempts: 3, initial_delay: 0.2, max_delay: 0.2 }) do |m|
        seen << [m.payload["n"], m.attempt, m.headers.slice(*TRACE.keys)]
        m.payload["n"] == 2 ? Ack.retry("not yet") : Ack.accept
      end
      mq.publish({ "n" => 1 }, to: queue)
      mq.publish({ "n" => 2 }, to: queue, headers: TRACE)
      mq.publish({ "n" => 3 }, to: queue)
      got = Array.new(5) { eventually(timeout: 10) { seen.pop(true) rescue nil } }
      eventually { sub.stats[:dead_lettered] == 1 }
      sub.cancel

      expect(got.select { |n, _, _| n == 2 }).to eq([[2, 1, TRACE], [2, 2, TRACE], [2, 3, TRACE]])
      expect(got.reject { |n, _, _| n == 2 }.sort_by(&:first)).to eq([[1, 1, {}], [3, 1, {}]])

      # The DLQ copy, read as any other client reads it, and put back.
      ch = outbox_bunny.create_channel
      info, props, = ch.basic_get("#{queue}.dlq", manual_ack: true)
      expect(props[:headers]).to include(TRACE)
      expect(props[:headers]).to include("x-acemq-attempt" => 3)
      ch.reject(info.delivery_tag, true)
      ch.close

      expect(mq.replay_dead_letters(queue).to_h).to eq(replayed: 1, skipped: 0)
      mq.publish({ "n" => 4 }, to: queue)
      sub = mq.consume(queue) { |m| seen << [m.payload["n"], m.attempt, m.headers.slice(*TRACE.keys)]; Ack.accept }
      back = Array.new(2) { eventually(timeout: 10) { seen.pop(true) rescue nil } }
      sub.cancel
      expect(back.sort_by(&:first)).to eq([[2, 1, TRACE], [4, 1, {}]])
    end
  end

  RSpec.describe "OpenTelemetry (a stand-in of its API) across the ladder" do
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
    let(:queue) { unique("traced-otel") }

    around { |ex| OpenTelemetryStandIn.install { ex.run } }
    before do
      AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
      broker_names[:queues].push(queue, "#{queue}.dlq")
    end
    after { mq.close }

    it "puts every attempt's consumer span in the publisher's trace, the child of its publish span" do
      otel = OpenTelemetryStandIn
      done = Queue.new
      sub = mq.consume(queue, retries: { max_attempts: 3, initial_delay: 0.2, max_delay: 0.2 }) do |m|
        m.attempt < 3 ? Ack.retry("not yet") : (done << true; Ack.accept)
      end
      otel.tracer_provider.tracer("app").in_span("POST /orders") { mq.publish({ "n" => 1 }, to: queue) }
      eventually(timeout: 10) { done.pop(true) rescue nil }
      sub.cancel
      publish = otel.spans.find { |s| s.name == "publish amq.default" }
      attempts = eventually { otel.spans.select { |s| s.name == "process #{queue}" }.then { |a| a.size == 3 && a } }
      expect(attempts.map { |s| s.attributes["acemq.attempt"] }).to eq([1, 2, 3])
      expect(attempts.map { |s| s.attributes["acemq.outcome"] }).to eq(%w[retry retry accept])
      expect(attempts.map { |s| s.context.trace_id }.uniq).to eq([publish.context.trace_id])
      expect(attempts.map { |s| s.parent.span_id }.uniq).to eq([publish.context.span_id])
    end
  end

  # The including group defines `db` (the application's connection) and `store`.
  RSpec.shared_examples "trace context through the outbox" do
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
    let(:queue) { unique("traced-ox") }

    before do
      AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
      broker_names[:queues].push(queue, "#{queue}.dlq")
      store.create_schema
    end
    after { mq.close }

    it "stores it with the row and publishes it with the message, unchanged, between two good messages" do
      db.transaction do
        store.add(Patterns.record(mq, { "n" => 1 }, to: queue), connection: db)
        store.add(Patterns.record(mq, { "n" => 2 }, to: queue, headers: TRACE), connection: db)
        store.add(Patterns.record(mq, { "n" => 3 }, to: queue), connection: db)
      end
      expect(Patterns::OutboxRelay.new(mq, store).sweep).to eq(3)
      seen = Queue.new
      sub = mq.consume(queue) { |m| seen << [m.payload["n"], m.headers.slice(*TRACE.keys)]; Ack.accept }
      got = Array.new(3) { eventually(timeout: 10) { seen.pop(true) rescue nil } }
      sub.cancel
      expect(got.sort_by(&:first)).to eq([[1, {}], [2, TRACE], [3, {}]])
    end
  end

  RSpec.describe "trace context through the outbox on SQLite" do
    let(:db) { outbox_sqlite(outbox_sqlite_path) }
    let(:store) { Patterns::SQLOutboxStore.new(connection: db, table: outbox_table) }

    it_behaves_like "trace context through the outbox"
  end

  RSpec.describe "trace context through the outbox on PostgreSQL" do
    let(:db) { outbox_pg }
    let(:table) { outbox_table.tap { |t| pg_tables_to_drop << t } }
    let(:store) { Patterns::SQLOutboxStore.new(connection: db, table: table) }

    after { db.close }

    it_behaves_like "trace context through the outbox"
  end
end
