# frozen_string_literal: true

require "spec_helper"
require "logger"
require "stringio"
require "active_support"
require "active_support/notifications"
require "acemq/rails"
require "acemq/rails/log_subscriber"

# The Ruby surface of docs/events.md on the in-process broker: names,
# ActiveSupport::Notifications and the log lines.
RSpec.describe "AceMQ events (Ruby)" do
  let(:mq) { AceMQ::AMQP::Connection.open(memory_url) }
  let(:queue) { unique("events") }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }

  after do
    @sub&.cancel
    mq.close
  end

  def handle(n = 1, &handler)
    n.times { |i| mq.publish({ "n" => i }, to: queue) }
    @sub = mq.consume(queue, &handler)
  end

  it "names events the Rails way and refuses names it does not know" do
    expect(AceMQ::Events::NAMES).to eq(%w[publish.acemq process.acemq retry.acemq dead_letter.acemq idempotency.acemq
                                         outbox.acemq connection.acemq subscription.acemq runner.acemq])
    expect { AceMQ.subscribe("procss") { nil } }.to raise_error(AceMQ::AMQP::ConfigurationError, /unknown event "procss"/)
    s = AceMQ.subscribe(:process) { nil }
    expect(s.pattern).to eq("process.acemq")
    AceMQ.unsubscribe(s)
  end

  describe "with ActiveSupport" do
    before { AceMQ::Events.active_support! }
    after { AceMQ::Events.active_support!(false) }

    it "publishes ActiveSupport::Notifications events with the same payload" do
      got = Queue.new
      as = ActiveSupport::Notifications.subscribe("process.acemq") { |*args| got << ActiveSupport::Notifications::Event.new(*args) }
      handle { AceMQ::AMQP::Ack.accept }
      event = eventually { got.pop(true) rescue nil } # rubocop:disable Style/RescueModifier
      expect(event.name).to eq("process.acemq")
      expect(event.payload).to include(queue: queue, outcome: "accepted", attempt: 1)
    ensure
      ActiveSupport::Notifications.unsubscribe(as) if as
    end

    it "logs one line per message at debug and failures at warn" do
      out = StringIO.new
      previous = AceMQ::Rails.config.logger
      AceMQ::Rails.config.logger = Logger.new(out, level: :debug)
      AceMQ::Rails::LogSubscriber.attach_to :acemq
      mq.publish({ "n" => 1 }, to: queue)
      mq.publish({ "n" => 2 }, to: queue)
      @sub = mq.consume(queue) { |m| m.payload["n"] == 1 ? AceMQ::AMQP::Ack.accept : AceMQ::AMQP::Ack.reject("bad card") }
      eventually { out.string.include?("dead_lettered") }
      expect(out.string).to match(/DEBUG -- : AceMQ process #{queue} \S+ accepted attempt 1 \(\d+\.\dms\)/)
      expect(out.string).to match(/WARN -- : AceMQ process #{queue} \S+ dead_lettered attempt 1 \(\d+\.\dms\): bad card/)
      expect(out.string).to match(/WARN -- : AceMQ dead_letter #{queue} \S+ attempt 1 to #{queue}\.dlq: bad card/)
    ensure
      AceMQ::Rails::LogSubscriber.detach_from :acemq
      AceMQ::Rails.config.logger = previous
    end
  end

  it "reports the guard's duplicate as the settlement's outcome whatever it keys by, once per verdict" do
    outcomes = Queue.new
    verdicts = Queue.new
    processed = AceMQ.subscribe("process.acemq") { |e| outcomes << e[:outcome] if e[:queue] == queue }
    guarded = AceMQ.subscribe("idempotency.acemq") { |e| verdicts << e[:verdict] if e[:queue] == queue }
    store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new(window: 3600)
    key = ->(m) { "order:#{m.payload['order']}" } # not the message id: two messages, one key
    2.times { |n| mq.publish({ "order" => "A-1", "n" => n }, to: queue) }
    @sub = mq.consume(queue, concurrency: 1, &AceMQ::AMQP::Patterns.idempotent(store, key: key) { AceMQ::AMQP::Ack.accept })
    eventually { outcomes.size == 2 }
    expect(Array.new(2) { outcomes.pop }).to eq(%w[accepted duplicate])
    expect(Array.new(verdicts.size) { verdicts.pop }).to eq(%w[duplicate])
  ensure
    AceMQ.unsubscribe(processed) if processed
    AceMQ.unsubscribe(guarded) if guarded
  end

  it "gives AceMQ.metrics as Prometheus text" do
    AceMQ::Events.record_metrics!
    handle { AceMQ::AMQP::Ack.accept }
    eventually { @sub.stats[:accepted] == 1 }
    text = eventually { (t = AceMQ.metrics).include?(%(messaging_destination_name="#{queue}",outcome="accepted"} 1)) && t }
    expect(text).to include("# TYPE messaging_client_consumed_messages counter")
  end
end
