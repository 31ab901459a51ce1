# frozen_string_literal: true

require_relative "../../drill/support"
require_relative "../../drill/node"

# The broker's consumer_timeout ends a consumer that held a delivery too
# long. RabbitMQ 3.10 and 4.0 close its channel (406); 4.3 cancels a quorum
# queue's consumer (basic.cancel, the channel left open) and no longer
# applies the timeout to classic queues at all (measured with
# `consumer_timeout = 2000`; docs/production.md). Either way the delivery is
# back in the queue, and the subscription must come back for it: a
# resubscription with the message redelivered, not a dead consumer.
#
# On a private node whose consumer_timeout is 2 s (and channel tick 0.5 s):
# a Drill::Node, or the node at ACEMQ_SHORT_TIMEOUT_URL started so, where the
# rabbitmq-server beside this Ruby is not the version under test.
RSpec.describe "the broker's consumer_timeout" do
  # A channel looks at its consumers' deliveries once a tick, a minute by
  # default (channel_tick_interval, advanced.config only): on 3.10 and 4.0
  # a 2 s timeout would fire up to 62 s late.
  class TickingNode < Drill::Node
    def env = super.merge("RABBITMQ_ADVANCED_CONFIG_FILE" => File.join(dir, "advanced.config"))
  end

  before(:all) do
    if (@url = ENV["ACEMQ_SHORT_TIMEOUT_URL"])
      @node = nil
    else
      @node = TickingNode.new(config: ["consumer_timeout = 2000"])
      File.write(File.join(@node.dir, "advanced.config"), "[{rabbit, [{channel_tick_interval, 500}]}].\n")
      @node.start
      @url = @node.url
    end
  end

  after(:all) { @node&.destroy }

  let(:mq) { AceMQ::AMQP::Connection.open(@url) }
  let(:version) { Gem::Version.new(mq.server_version) }

  after { mq.close }

  # The handler deadline is the engine's own answer to a slow handler, and
  # it refuses one past the broker's timeout: told the broker's timeout is
  # an hour, it waits long enough for the broker's to fire first.
  def slow_first_time(queue, type)
    AceMQ::AMQP::Topology.new.queue(queue, type: type).apply(mq)
    seen = Queue.new
    @notices = []
    sub = mq.consume(queue, timeout: 1800, consumer_timeout: 3600, on_error: ->(e) { @notices << e }) do |m|
      seen << [m.payload["n"], m.delivery.redelivered?]
      sleep 6 if seen.size == 1 # held past the broker's 2 s
      AceMQ::AMQP::Ack.accept
    end
    mq.publish({ "n" => 1 }, to: queue)
    [sub, seen]
  end

  def resubscribed? = @notices.any? { |e| e.is_a?(AceMQ::AMQP::ConnectionClosed) && e.message.include?("subscribed again") }

  it "on a quorum queue: the consumer is ended, subscribes again and gets the message again" do
    queue = unique("ctimeout-quorum")
    sub, seen = slow_first_time(queue, :quorum)
    eventually(timeout: 30) { seen.size >= 2 }
    expect(Array.new(2) { seen.pop }).to eq([[1, false], [1, true]])
    eventually(timeout: 15) { sub.stats[:accepted] >= 1 && mq.queue_counts(queue)[:ready].zero? }
    eventually(timeout: 5) { resubscribed? }
    expect(sub).to be_alive
    # Still consuming: a new message is handled on the new subscription.
    mq.publish({ "n" => 2 }, to: queue)
    expect(eventually(timeout: 10) { seen.pop(true) rescue nil }).to eq([2, false])
    sub.cancel
  end

  it "on a classic queue: what this version does (the channel closed on 3.10 and 4.0; left alone on 4.3)" do
    queue = unique("ctimeout-classic")
    sub, seen = slow_first_time(queue, :classic)
    if version >= Gem::Version.new("4.3")
      eventually(timeout: 15) { sub.stats[:accepted] == 1 }
      expect(seen.size).to eq(1)
      expect(resubscribed?).to be(false)
    else
      eventually(timeout: 30) { seen.size >= 2 }
      expect(Array.new(2) { seen.pop }).to eq([[1, false], [1, true]])
      eventually(timeout: 15) { sub.stats[:accepted] >= 1 && mq.queue_counts(queue)[:ready].zero? }
      eventually(timeout: 5) { resubscribed? }
    end
    expect(sub).to be_alive
    sub.cancel
  end

  it "checks the handler deadline against consumer_timeout only where the broker applies it" do
    classic = unique("ctimeout-check")
    AceMQ::AMQP::Topology.new.queue(classic).apply(mq)
    # A deadline past the broker's consumer_timeout: refused where the
    # broker would end the consumer first, accepted on 4.3's classic queue.
    open = -> { mq.consume(classic, timeout: 10, consumer_timeout: 2) { AceMQ::AMQP::Ack.accept } }
    if version >= Gem::Version.new("4.3")
      open.call.cancel
    else
      expect { open.call }.to raise_error(AceMQ::AMQP::ConfigurationError, /consumer_timeout/)
    end
    quorum = unique("ctimeout-check-q")
    AceMQ::AMQP::Topology.new.queue(quorum, type: :quorum).apply(mq)
    expect { mq.consume(quorum, timeout: 10, consumer_timeout: 2) { AceMQ::AMQP::Ack.accept } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /consumer_timeout/)
  end
end
