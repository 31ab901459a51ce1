# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "sqlite3"
require "pg"

module OutboxStep6Spec
  Patterns = AceMQ::AMQP::Patterns
  Ack = AceMQ::AMQP::Ack

  # Tutorial 3 Step 6, the order of operations: the idempotency guard outside
  # the transaction, the work and the outgoing message committed together, the
  # key confirmed after the handler accepted, and the relay publishing
  # afterwards from committed rows.
  RSpec.describe "Tutorial 3 Step 6: the idempotent consumer with the outbox" do
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
    let(:payments_queue) { unique("payments") }
    let(:payments_table) { outbox_table("payments") }
    let(:table) { outbox_table }
    let(:idem_table) { outbox_table("idem") }

    before do
      AceMQ::AMQP::Topology.new.queue(payments_queue).apply(mq)
      broker_names[:queues].push(payments_queue, "#{payments_queue}.dlq", *(1..5).map { |n| "#{payments_queue}.retry.#{n}" })
      pg_tables_to_drop.push(payments_table, table, idem_table)
    end

    after { mq.close }

    shared_examples "Step 6" do
      it "does the work and says so once, for a duplicate and for a handler that failed inside its transaction" do
        billing_events, receipts_queue = destination(mq, exchange: unique("billing-events"), routing_key: "payment.taken")
        db = connect.call
        payments = OutboxSpecHelpers::Orders.new(db, payments_table)
        outbox = Patterns::SQLOutboxStore.new(connection: connect.call, table: table) # the relay's own connection
        outbox.create_schema
        store = idempotency_store.call
        store.create_schema
        failed_once = Queue.new

        subscription = mq.consume(payments_queue, retries: { initial_delay: 0.1, max_delay: 0.1 },
                                                  on_error: ->(_) {}, &Patterns.idempotent(store) do |message|
          receipt = { "payment_id" => message.payload["id"] }
          db.transaction do
            payments.insert(message.payload)                       # the work
            outbox.add(Patterns.record(mq, receipt, to: "payment.taken",
                                                    exchange: billing_events),
                       connection: db)                             # and what to say about it
            if message.payload["id"] == "P-2" && failed_once.empty?
              failed_once << true
              raise IOError, "the card network timed out"          # after the add: both roll back
            end
          end
          Ack.accept
        end)

        duplicate = AceMQ::AMQP::Envelope.new(type: "payment.requested.v1")
        mq.publish({ "id" => "P-1", "total" => 100 }, to: payments_queue, envelope: duplicate)
        mq.publish({ "id" => "P-1", "total" => 100 }, to: payments_queue, envelope: duplicate)
        mq.publish({ "id" => "P-2", "total" => 200 }, to: payments_queue)

        reader = OutboxSpecHelpers::Orders.new(connect.call, payments_table)
        eventually(timeout: 10) { reader.count == 2 && outbox.backlog.count == 2 && subscription.stats[:accepted].to_i >= 3 rescue false }
        subscription.cancel
        expect(failed_once.size).to eq(1)
        expect(store.confirmed?(duplicate.id)).to be(true)

        relay = Patterns::OutboxRelay.new(mq, outbox, interval: 1)
        expect(relay.sweep).to eq(2)
        receipts = drain(receipts_queue, expect: 2).map { |_, body| JSON.parse(body)["payment_id"] }
        expect(receipts).to match_array(%w[P-1 P-2])
        expect(outbox.backlog.count).to eq(0)
      end
    end

    context "on SQLite" do
      let(:path) { outbox_sqlite_path }
      let(:connect) { -> { outbox_sqlite(path) } }
      let(:idempotency_store) { -> { Patterns::SQLIdempotencyStore.new(path: path, table: idem_table) } }

      include_examples "Step 6"
    end

    context "on PostgreSQL" do
      let(:connect) { -> { outbox_pg } }
      let(:idempotency_store) { -> { Patterns::SQLIdempotencyStore.new(connection: outbox_pg, table: idem_table) } }

      include_examples "Step 6"
    end
  end
end
