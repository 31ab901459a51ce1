# frozen_string_literal: true

require "acemq/rails"

# A Rails consumer answering requests with reply(payload), on memory://:
# plain and behind the idempotent macro, and called directly in a spec.
RSpec.describe "AceMQ::Rails::Consumer#reply" do
  let(:mq) { AceMQ::AMQP::Connection.open(memory_url) }
  let(:queue) { unique("quotes") }
  let(:store) { AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new }

  before { AceMQ::Rails.publisher = mq }

  after do
    @sub&.cancel
    AceMQ::Rails.publisher = nil
    mq.close
    Object.send(:remove_const, :ReplySpecQuotes) if Object.const_defined?(:ReplySpecQuotes)
  end

  def quotes(idempotent: false)
    q = queue
    guard = store
    klass = Class.new(AceMQ::Rails::Consumer) do
      queue q
      concurrency 2
      idempotent store: guard if idempotent

      def call(message)
        raise ArgumentError, "qty must not be negative" if message.payload["qty"].negative?

        reply({ "quote" => message.payload["qty"] * 3 })
        accept
      end
    end
    Object.const_set(:ReplySpecQuotes, klass)
  end

  it "replies to the request being handled, from each handler thread" do
    klass = quotes
    klass.topology.apply(mq)
    @sub = klass.subscribe(mq)
    answers = Array.new(4) { |i| Thread.new { mq.request({ "qty" => i }, to: queue).payload["quote"] } }.map(&:value)
    expect(answers).to eq([0, 3, 6, 9])
  end

  it "behind the idempotent macro: a duplicate request runs nothing and is not answered" do
    klass = quotes(idempotent: true)
    klass.topology.apply(mq)
    @sub = klass.subscribe(mq)
    envelope = AceMQ::AMQP::Envelope.new(id: unique("quote"))
    expect(mq.request({ "qty" => 2 }, to: queue, envelope: envelope).payload).to eq("quote" => 6)
    expect { mq.request({ "qty" => 2 }, to: queue, envelope: envelope, timeout: 0.3) }
      .to raise_error(AceMQ::AMQP::TimeoutError)
  end

  [false, true].each do |idempotent|
    it "a call that raises is a RemoteError to its requester at once#{' (idempotent: asked again, it runs)' if idempotent}" do
      klass = quotes(idempotent: idempotent)
      klass.topology.apply(mq)
      @sub = klass.subscribe(mq)
      envelope = AceMQ::AMQP::Envelope.new(id: unique("quote"))
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      expect { mq.request({ "qty" => -1 }, to: queue, envelope: envelope, timeout: 30) }
        .to raise_error(AceMQ::AMQP::RemoteError, "qty must not be negative") { |e| expect(e.remote_class).to eq("ArgumentError") }
      expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 5
      # The guard forgot its claim with the failure: the same request asked
      # again runs, rather than being taken for a duplicate.
      expect(mq.request({ "qty" => 2 }, to: queue, envelope: envelope, timeout: 5).payload).to eq("quote" => 6)
    end
  end

  it "needs the request when called outside a subscription, and takes it as to:" do
    klass = quotes
    message = AceMQ::AMQP::Message.new(payload: { "qty" => 1 })
    expect { klass.new.call(message) }.to raise_error(AceMQ::AMQP::ConfigurationError, /needs the request/)
  end
end
