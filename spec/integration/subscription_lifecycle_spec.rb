# frozen_string_literal: true

# Cancelling a subscription in the awkward places: from its own handler, and
# after a handler thread died of an exception a handler may not swallow.
RSpec.describe "Subscription#cancel" do
  let(:mq) { AceMQ::AMQP::Connection.open(url) }
  let(:queue) { unique("cancel") }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
  after { mq.close }

  shared_examples "cancel in awkward places" do
    it "settles the delivery of a handler that cancels its own subscription, then closes" do
      done = Queue.new
      sub = nil
      sub = mq.consume(queue) do |m|
        sub.cancel
        done << m.payload["n"]
        AceMQ::AMQP::Ack.accept
      end
      mq.publish({ "n" => 1 }, to: queue)
      expect(eventually { done.pop(true) rescue nil }).to eq(1)
      eventually { !sub.alive? }
      expect(sub.stats[:accepted]).to eq(1)
      # Accepted, not put back: a new consumer sees only what comes next.
      got = Queue.new
      again = mq.consume(queue) { |m| got << m.payload["n"]; AceMQ::AMQP::Ack.accept }
      mq.publish({ "n" => 2 }, to: queue)
      expect(eventually { got.pop(true) rescue nil }).to eq(2)
      again.cancel
    end

    # An exception that is not a StandardError passes through the handler,
    # and its thread ends; its delivery goes round the retry ladder at once
    # and a fresh thread takes the place (spec/integration/handler_aborts_spec.rb).
    it "closes after a handler thread died of an Interrupt, its delivery sent round the ladder" do
      sub = mq.consume(queue) { |m| m.payload["die"] ? raise(Interrupt) : AceMQ::AMQP::Ack.accept }
      sub.instance_variable_get(:@threads).each { |t| t.report_on_exception = false }
      mq.publish({ "die" => true, "n" => 1 }, to: queue)
      eventually { sub.stats[:retried] == 1 }
      expect(sub.dead_workers).to eq(0)
      expect { sub.cancel }.not_to raise_error
      expect(sub).to be_cancelled
      got = Queue.new
      again = mq.consume(queue) { |m| got << m; AceMQ::AMQP::Ack.accept }
      m = eventually(timeout: 10) { got.pop(true) rescue nil }
      expect(m.payload["n"]).to eq(1)
      expect(m.attempt).to eq(2)
      again.cancel
    end
  end

  context "on memory://" do
    let(:url) { memory_url }

    include_examples "cancel in awkward places"
  end

  context "on RabbitMQ" do
    let(:url) { AMQP_URL }

    include_examples "cancel in awkward places"
  end
end
