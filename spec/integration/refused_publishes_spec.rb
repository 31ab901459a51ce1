# frozen_string_literal: true

require_relative "../../drill/support"
require_relative "../../drill/node"

# A publish the broker refuses makes it close the channel the publish came
# on, and every publish in flight on that channel with it. Publishes on one
# connection share one publishing channel, so in issue 47's hostile run a
# thread publishing to an exchange it may not write failed 484 of 500 good
# publishes on another thread with its AccessRefused (402 of them stored),
# and oversized ones failed all 500 with the other's PreconditionFailed.
#
# Now: the first publish to an exchange goes alone on a channel of its own
# (a refused one never reaches the shared channel), a size the broker
# refused once is refused before it is sent, and a publish caught in
# another's refusal says so (ConnectionClosed, "for another publish"), never
# with the other's error. On a private node: a user who may not write to
# one exchange, and a max_message_size of 64 KiB.
RSpec.describe "refused publishes beside good ones on one connection" do
  before(:all) do
    @node = Drill::Node.new(config: ["max_message_size = 65536"])
    @node.start
    @node.ctl!("add_user", "lim", "lim")
    @node.ctl!("set_permissions", "lim", ".*", "^(?!ro-ex$).*", ".*")
    admin = AceMQ::AMQP::Connection.open(@node.url)
    AceMQ::AMQP::Topology.new.exchange("ro-ex", type: :fanout).apply(admin)
    admin.close
    @url = @node.url.sub("guest:guest", "lim:lim")
  end

  after(:all) { @node&.destroy }

  let(:mq) { AceMQ::AMQP::Connection.open(@url) }
  let(:queue) { "refused-#{SecureRandom.hex(4)}" }

  after { mq.close }

  # Publish n of `payload` to `to:`/`exchange:` on a thread; the outcomes.
  def publisher(n, payload, **where)
    Thread.new do
      Array.new(n) do
        mq.publish(payload, **where)
        :ok
      rescue AceMQ::AMQP::Error => e
        e
      end
    end
  end

  def ready(q) = mq.queue_counts(q)&.fetch(:ready)

  it "a publish to an exchange the user may not write fails alone" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    good = publisher(300, { "n" => 1 }, to: queue)
    bad = publisher(300, { "n" => 2 }, to: "", exchange: "ro-ex")
    good = good.value
    bad = bad.value
    expect(good.count(:ok)).to eq(300), "good publishes failed: #{good.reject { |r| r == :ok }.first(3).inspect}"
    expect(bad).to all(be_a(AceMQ::AMQP::AccessRefused))
    expect(bad.first.message).to include("ro-ex")
    expect(ready(queue)).to eq(300)
    # lapin gives a closed channel's id back on its own task, a moment after
    # the close: the refused ones' channels are gone once that has run.
    eventually(timeout: 3) { mq.resources.channels <= 1 }
  end

  it "an oversized publish fails with what to do, and catches at most the first in flight beside it" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    good = publisher(300, { "n" => 1 }, to: queue)
    big = publisher(100, { "blob" => "x" * 100_000 }, to: queue)
    good = good.value
    big = big.value
    expect(big).to all(be_a(AceMQ::AMQP::PreconditionFailed))
    expect(big.map(&:message)).to all(include("max_message_size 65536"))
    caught = good.reject { |r| r == :ok }
    # Only the first oversized publish reaches the broker: those in flight
    # beside it are told it was another's and that they may be stored.
    expect(caught).to all(be_a(AceMQ::AMQP::ConnectionClosed))
    expect(caught.map(&:message)).to all(include("for another publish"))
    expect(caught.size).to be <= 20
    expect(ready(queue)).to be >= good.count(:ok)
    # Refused here, not sent: the connection publishes on.
    mq.publish({ "n" => 3 }, to: queue)
    expect(ready(queue)).to be >= good.count(:ok) + 1
  end

  it "good, refused and oversized publishes on three threads: the connection stays open and good ones fail only as caught" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    threads = [publisher(300, { "n" => 1 }, to: queue), publisher(200, { "n" => 2 }, to: "", exchange: "ro-ex"),
               publisher(50, { "blob" => "x" * 100_000 }, to: queue)]
    good, refused, big = threads.map(&:value)
    expect(refused).to all(be_a(AceMQ::AMQP::AccessRefused))
    expect(big).to all(be_a(AceMQ::AMQP::PreconditionFailed))
    caught = good.reject { |r| r == :ok }
    expect(caught).to all(be_a(AceMQ::AMQP::ConnectionClosed))
    expect(caught.size).to be <= 20
    q2 = "#{queue}-after"
    AceMQ::AMQP::Topology.new.queue(q2).apply(mq)
    mq.publish({ "after" => true }, to: q2)
    expect(ready(q2)).to eq(1)
  end
end
