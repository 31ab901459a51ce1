# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"

module IdempotencySpec
  Ack = AceMQ::AMQP::Ack
  Patterns = AceMQ::AMQP::Patterns

  RSpec.describe "AceMQ::AMQP::Patterns idempotency" do

    def message(id: "m-1", payload: { "order_id" => "A-1", "amount_cents" => 1299 })
      AceMQ::AMQP::Message.new(payload: payload,
                               envelope: AceMQ::AMQP::Envelope.new(id: id, type: "payment.due.v1"))
    end

    # A store written the way an application would: a Hash, and a log of what
    # the guard asked of it.
    class RecordingStore
      attr_reader :calls, :keys

      def initialize
        @keys = {}
        @calls = []
      end

      def first_time?(key)
        @calls << [:first_time?, key]
        return false if @keys.key?(key)

        @keys[key] = :claimed
        true
      end

      def confirm(key)
        @calls << [:confirm, key]
        @keys[key] = :confirmed
      end

      def forget(key)
        @calls << [:forget, key]
        @keys.delete(key) if @keys[key] == :claimed
      end

      def confirmed?(key) = @keys[key] == :confirmed
    end

    # Only the one required method: the guard must never call confirm or forget.
    class FirstTimeOnlyStore
      def initialize = @seen = {}
      def first_time?(key) = !!@seen[key] == false && (@seen[key] = true)
    end

    let(:store) { Patterns::InMemoryIdempotencyStore.new(window: 6 * 3600) }

    describe "Patterns.idempotent" do
      it "returns a Proc that runs the handler once per key and accepts the duplicates" do
        charged = []
        handler = Patterns.idempotent(store) { |m| charged << m.payload["order_id"]; Ack.accept }

        expect(handler).to be_a(Proc)
        results = 3.times.map { handler.call(message) }

        expect(results).to all(be_accept)
        expect(charged).to eq(["A-1"])
        expect(store.confirmed?("m-1")).to be(true)
        expect(handler.stats).to include(duplicates: 2, runs: 1, confirmed: 1)
      end

      it "goes into consume with & (Tutorial 3 Step 2, on the in-process broker)" do
        mq = AceMQ::AMQP::Connection.open(memory_url)
        AceMQ::AMQP::Topology.new.queue("payments").apply(mq)
        charged = []
        sub = mq.consume("payments", &Patterns.idempotent(store) do |m|
          charged << m.payload["order_id"]
          Ack.accept
        end)
        envelope = AceMQ::AMQP::Envelope.new(type: "payment.requested.v1")
        2.times { mq.publish({ "order_id" => "A-1", "amount" => 4200 }, to: "payments", envelope: envelope) }

        eventually { sub.stats[:accepted] == 2 }
        expect(charged).to eq(["A-1"])
      ensure
        sub&.cancel
        mq&.close
      end

      it "forgets the key when the handler retries, so the retry really runs" do
        runs = 0
        handler = Patterns.idempotent(store) { runs += 1; runs == 1 ? Ack.retry("gateway timeout") : Ack.accept }

        expect(handler.call(message)).to be_retry
        expect(handler.call(message)).to be_accept
        expect(handler.call(message)).to be_accept
        expect(runs).to eq(2)
        expect(handler.stats).to include(forgotten: 1, confirmed: 1, duplicates: 1)
      end

      it "forgets the key when the handler rejects" do
        handler = Patterns.idempotent(store) { Ack.reject("bad card") }
        expect(handler.call(message).reason).to eq("bad card")
        expect(store.size).to eq(0)
      end

      it "forgets the key and re-raises the same exception when the handler raises" do
        boom = RuntimeError.new("gateway down")
        runs = 0
        handler = Patterns.idempotent(store) { runs += 1; raise boom if runs == 1; Ack.accept }

        expect { handler.call(message) }.to raise_error { |e| expect(e).to be(boom) }
        expect(store.size).to eq(0)
        expect(handler.call(message)).to be_accept
        expect(runs).to eq(2)
      end

      it "forgets the key when the handler's thread is killed, and lets the kill through" do
        started = Queue.new
        handler = Patterns.idempotent(store) { started << true; sleep }
        t = Thread.new { handler.call(message) }
        started.pop
        t.kill
        t.join(5)

        expect(t).not_to be_alive
        expect(store.size).to eq(0)
        expect(handler.stats).to include(abandoned: 1, forgotten: 1)
      end

      it "passes through a value that is not an Ack, and forgets the key" do
        handler = Patterns.idempotent(store) { :ok }
        expect(handler.call(message)).to eq(:ok)
        expect(store.size).to eq(0)
      end

      it "rejects a message with no key as fatal, without running the handler" do
        ran = false
        [Patterns.idempotent(store, key: ->(_) { nil }) { ran = true },
         Patterns.idempotent(store, key: ->(_) { "" }) { ran = true },
         Patterns.idempotent(store) { ran = true }].each_with_index do |handler, i|
          m = i == 2 ? message(id: nil) : message # no id at all, as a foreign publisher's message arrives
          ack = handler.call(m)
          expect(ack).to be_reject
          expect(ack.error_class).to eq("AceMQ::AMQP::FatalError")
          expect(ack.reason).to include("idempotency key is missing", "key:")
          expect(handler.stats[:missing_keys]).to eq(1)
        end
        expect(ran).to be(false)
      end

      it "waits without spending an attempt, handler not run, when the store raises" do
        broken = Object.new
        def broken.first_time?(_key) = raise(IOError, "database is locked")
        ran = false
        handler = Patterns.idempotent(broken) { ran = true }

        ack = handler.call(message)
        expect(ack).to be_wait
        expect(ack.up_to).to eq(AceMQ::AMQP::SQL::OUTAGE_WAIT) # the engine's STORE_OUTAGE_WAIT
        expect(ack.reason).to include("idempotency store failed", "IOError", "database is locked")
        expect(ran).to be(false)
        expect(handler.stats[:store_errors]).to eq(1)
      end

      it "lets a throw (not a StandardError) out of the store untouched" do
        jumpy = Object.new
        def jumpy.first_time?(_key) = throw(:out, :thrown)
        handler = Patterns.idempotent(jumpy) { Ack.accept }
        expect(catch(:out) { handler.call(message) }).to eq(:thrown)
      end

      it "keys on the key: function, as text whatever its encoding" do
        handler = Patterns.idempotent(store, key: ->(m) { "charge:#{m.payload['order_id']}".b }) { Ack.accept }
        handler.call(message(id: "m-1"))

        expect(handler.call(message(id: "m-2"))).to be_accept
        expect(handler.stats[:duplicates]).to eq(1)
        expect(store.confirmed?("charge:A-1")).to be(true)
      end

      it "drives a hand-written store: confirm on accept, forget otherwise" do
        rs = RecordingStore.new
        handler = Patterns.idempotent(rs) { |m| m.payload["ok"] ? Ack.accept : Ack.retry("no") }
        handler.call(message(id: "a", payload: { "ok" => true }))
        handler.call(message(id: "b", payload: { "ok" => false }))
        handler.call(message(id: "a", payload: { "ok" => true }))

        expect(rs.calls).to eq([[:first_time?, "a"], [:confirm, "a"], [:first_time?, "b"], [:forget, "b"],
                                [:first_time?, "a"]])
      end

      it "calls neither confirm nor forget on a store that answers only first_time?" do
        handler = Patterns.idempotent(FirstTimeOnlyStore.new) { |m| m.id == "a" ? Ack.accept : Ack.retry("no") }
        expect(handler.call(message(id: "a"))).to be_accept
        expect(handler.call(message(id: "b"))).to be_retry
        expect(handler.call(message(id: "a"))).to be_accept
        expect(handler.stats).to include(runs: 2, duplicates: 1, confirmed: 0, forgotten: 0)
      end

      it "keeps the handler's outcome when confirm fails, and reports it" do
        rs = RecordingStore.new
        def rs.confirm(_key) = raise("confirm lost")
        events = []
        sub = Patterns.on(:confirm_failed) { |e, d| events << [e, d[:key], d[:error]] }
        handler = Patterns.idempotent(rs) { Ack.accept }

        expect(handler.call(message)).to be_accept
        expect(events).to eq([[:confirm_failed, "m-1", "the store's confirm raised RuntimeError: confirm lost"]])
        expect(handler.stats[:confirm_errors]).to eq(1)
      ensure
        Patterns.off(sub) if sub
      end

      it "calls the block as it is, so a consumer's private accept works (the seed's Rails shape)" do
        consumer = Class.new do
          def initialize(store) = @store = store
          def call(message) = once.call(message)

          private

          def accept = AceMQ::AMQP::Ack.accept
          def once = @once ||= AceMQ::AMQP::Patterns.idempotent(@store) { |_m| accept }
        end.new(store)

        expect(consumer.call(message)).to be_accept
        expect(consumer.call(message)).to be_accept
      end

      it "needs a block" do
        expect { Patterns.idempotent(store) }.to raise_error(AceMQ::AMQP::ConfigurationError, /needs a block/)
      end
    end

    describe "Patterns.with_idempotency and Patterns.pipeline" do
      it "has the same semantics as middleware" do
        charged = []
        app = Patterns.pipeline(Patterns.with_idempotency(store)) { |m| charged << m.id; Ack.accept }

        expect(3.times.map { app.call(message) }).to all(be_accept)
        expect(charged).to eq(["m-1"])
        expect(Patterns.pipeline(Patterns.with_idempotency(store, key: ->(_) { nil }), ->(_) { Ack.accept })
                       .call(message)).to be_reject
      end

      it "runs middlewares outermost first, and a two-argument lambda is a middleware" do
        trail = []
        outer = ->(m, app) { trail << :outer; app.call(m).tap { trail << :outer_done } }
        guard = Patterns.with_idempotency(store)
        app = Patterns.compose(outer, guard, ->(_m) { trail << :handler; Ack.accept })

        app.call(message)
        app.call(message)
        expect(trail).to eq(%i[outer handler outer_done outer outer_done])
        expect(guard.stats[:duplicates]).to eq(1)
      end

      it "refuses what is not a middleware or a handler" do
        expect { Patterns.pipeline(Object.new, ->(_) {}) }.to raise_error(AceMQ::AMQP::ConfigurationError, /middleware/)
        expect { Patterns.pipeline }.to raise_error(AceMQ::AMQP::ConfigurationError, /handler/)
      end
    end

    describe "instrumentation" do
      it "reports duplicates to on_duplicate subscribers until they are removed" do
        seen = []
        sub = Patterns.on_duplicate { |_e, d| seen << d[:key] }
        handler = Patterns.idempotent(store) { Ack.accept }
        2.times { handler.call(message) }
        Patterns.off(sub)
        handler.call(message)

        expect(seen).to eq(["m-1"])
      end

      it "refuses an unknown event" do
        expect { Patterns.on(:dupes) {} }.to raise_error(AceMQ::AMQP::ConfigurationError, /unknown event/)
      end
    end

    describe "bad inputs" do
      it "refuses a store without first_time?" do
        expect { Patterns.idempotent(Object.new) { Ack.accept } }
          .to raise_error(AceMQ::AMQP::ConfigurationError, /must answer first_time\?\(key\)/)
        expect { Patterns.with_idempotency({}) }.to raise_error(AceMQ::AMQP::ConfigurationError)
      end

      it "refuses a key: that cannot be called" do
        expect { Patterns.with_idempotency(store, key: "order_id") }
          .to raise_error(AceMQ::AMQP::ConfigurationError, /key: must answer call/)
      end

      it "raises EncodingError for a binary key that is not UTF-8, rather than merging it with another" do
        expect { store.first_time?("\xFF\xFE".b) }.to raise_error(AceMQ::AMQP::EncodingError, /not UTF-8/)
        expect { store.first_time?(nil) }.to raise_error(ArgumentError, /required/)
      end

      it "refuses an object SQL.connect cannot drive, naming the methods it needs" do
        expect { AceMQ::AMQP::SQL.connect(Object.new) }
          .to raise_error(AceMQ::AMQP::SQL::UnsupportedConnection, /exec_params.*execute and changes.*call/m)
        expect { Patterns::SQLIdempotencyStore.new(connection: 42) }
          .to raise_error(AceMQ::AMQP::ConfigurationError, /cannot use Integer/)
      end

      it "wants exactly one of connection: and path:" do
        expect { Patterns::SQLIdempotencyStore.new }.to raise_error(AceMQ::AMQP::ConfigurationError, /exactly one/)
        expect { Patterns::SQLIdempotencyStore.new(connection: -> {}, path: "x.db") }
          .to raise_error(AceMQ::AMQP::ConfigurationError, /exactly one/)
      end

      it "says what a connection: callable returned when it is not a connection" do
        s = Patterns::SQLIdempotencyStore.new(connection: -> { nil })
        expect { s.first_time?("k") }.to raise_error(AceMQ::AMQP::StoreError, /callable returned nil/)
      end

      it "refuses a table name that is not a plain identifier" do
        expect { Patterns::SQLIdempotencyStore.new(connection: -> {}, table: "x; drop table y") }
          .to raise_error(AceMQ::AMQP::ConfigurationError, /plain identifier/)
      end
    end

    describe Patterns::InMemoryIdempotencyStore do
      it "has the three states: a stale claim is taken over, a confirmed key never is" do
        s = described_class.new(window: 60, claim_timeout: 0.2)
        expect(s.first_time?("claimed")).to be(true)
        expect(s.first_time?("done")).to be(true)
        s.confirm("done")
        expect(s.first_time?("claimed")).to be(false)

        eventually(timeout: 3) { s.first_time?("claimed") }
        expect(s.first_time?("done")).to be(false)
        expect(s.confirmed?("done")).to be(true)
      end

      it "forgets keys after the window" do
        s = described_class.new(window: 0.2)
        s.first_time?("k")
        s.confirm("k")
        expect(s.size).to eq(1)
        eventually(timeout: 3) { s.size.zero? }
        expect(s.first_time?("k")).to be(true)
      end

      it "treats a binary key and the UTF-8 key of the same text as one key" do
        expect(store.first_time?("m-1".b)).to be(true)
        store.confirm("m-1")
        expect(store.confirmed?("m-1".b)).to be(true)
        expect(store.first_time?("m-1")).to be(false)
      end
    end
  end

end

# The seed's consumer spec, with a plain Ruby class standing in for the Rails
# base class (which comes with the Rails consumer).
module Payments
  def self.charge!(_order_id, _amount_cents) = nil
end

class PaymentsConsumer
  STORE = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new

  def call(message)
    once.call(message)
  end

  private

  def accept = AceMQ::AMQP::Ack.accept

  # Built once per instance, as in the guide. STORE is read when the first
  # message arrives, which is why stub_const before the first call works.
  def once
    @once ||= AceMQ::AMQP::Patterns.idempotent(self.class::STORE) do |m|
      Payments.charge!(m.payload["order_id"], m.payload["amount_cents"])
      accept
    end
  end
end

RSpec.describe PaymentsConsumer do
  let(:store) { AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new }
  let(:message) do
    AceMQ::AMQP::Message.new(
      payload: { "order_id" => "A-1", "amount_cents" => 1299 },
      envelope: AceMQ::AMQP::Envelope.new(id: "m-1", type: "payment.due.v1")
    )
  end

  before { allow(Payments).to receive(:charge!) }

  it "charges once however many times the broker delivers it" do
    consumer = described_class.new
    stub_const("#{described_class}::STORE", store)

    3.times { expect(consumer.call(message)).to be_accept }

    expect(Payments).to have_received(:charge!).once
  end
end
