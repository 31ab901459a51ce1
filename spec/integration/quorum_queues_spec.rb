# frozen_string_literal: true

require "bunny"
require "shellwords"

# Quorum queues through the whole ladder, on RabbitMQ 3.10, 4.0 and 4.3: the
# queue, its DLQ and its rungs are quorum queues; the rungs and the main
# queue dead-letter at least once; the broker's own delivery limit lands a
# message in {queue}.dlq with its x-death reason. What counts toward that
# limit changed in 4.3 (basic.nack with requeue no longer does): the
# examples read the broker's version from the connection and expect what
# that version was measured to do (docs/production.md).
RSpec.describe "quorum queues" do
  let(:queue) { unique("quorum") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:version) { Gem::Version.new(mq.server_version) }

  before(:all) { @bunny = Bunny.new(AMQP_URL, logger: Logger.new(nil)).tap(&:start) }
  after(:all) { @bunny.close }
  after { mq.close }

  # name => [type, arguments text] as the broker reports them. RABBITMQCTL
  # names the command for a broker that is not this machine's (a chroot's
  # node), as for `rake acemq:status`.
  def declared(prefix)
    ctl = Shellwords.split(ENV.fetch("RABBITMQCTL", "rabbitmqctl"))
    IO.popen([*ctl, *%w[list_queues -q --no-table-headers name type arguments]], err: File::NULL, &:read).lines
      .map { |l| l.chomp.split("\t", 3) }.select { |n, _, _| n.start_with?(prefix) }
      .to_h { |n, t, a| [n, [t, a]] }
  end

  it "declares the queue, its DLQ and its rungs as quorum queues that dead-letter at least once" do
    AceMQ::AMQP::Topology.new.queue(queue, type: :quorum).apply(mq)
    sub = mq.consume(queue, retries: { max_attempts: 3, initial_delay: 1, max_delay: 2 }) { AceMQ::AMQP::Ack.accept }
    sub.cancel
    q = declared(queue)
    expect(q.keys).to contain_exactly(queue, "#{queue}.dlq", "#{queue}.retry.1s", "#{queue}.retry.2s")
    expect(q.values.map(&:first)).to all(eq("quorum"))
    main = q[queue].last
    expect(main).to include("at-least-once", "reject-publish", "x-delivery-limit", "#{queue}.dlq")
    expect(q["#{queue}.retry.1s"].last).to include("at-least-once", "reject-publish", "x-message-ttl")
    expect(q["#{queue}.dlq"].last).not_to include("x-dead-letter-exchange")
    expect(q["#{queue}.dlq"].last).to include("x-delivery-limit", "1000000000")
  end

  it "climbs the ladder on quorum rungs and dead-letters with the reason" do
    AceMQ::AMQP::Topology.new.queue(queue, type: :quorum).apply(mq)
    attempts = Queue.new
    sub = mq.consume(queue, retries: { max_attempts: 2, initial_delay: 0.2, max_delay: 0.2 }) do |m|
      attempts << [m.payload["n"], m.attempt]
      m.payload["n"] == 1 && m.attempt == 1 ? AceMQ::AMQP::Ack.retry("once more") : AceMQ::AMQP::Ack.accept
    end
    mq.publish({ "n" => 1 }, to: queue)
    eventually(timeout: 10) { sub.stats[:accepted] == 1 }
    expect(Array.new(attempts.size) { attempts.pop }).to eq([[1, 1], [1, 2]])
    expect(sub.stats[:retried]).to eq(1)
    sub.cancel

    failing = mq.consume(queue, retries: { max_attempts: 2, initial_delay: 0.2, max_delay: 0.2 }) do
      AceMQ::AMQP::Ack.retry("gateway down")
    end
    mq.publish({ "n" => 2 }, to: queue)
    eventually(timeout: 10) { failing.stats[:dead_lettered] == 1 }
    failing.cancel
    letter = mq.peek_dead_letters(queue, limit: 1).first
    expect(letter).to have_attributes(attempt: 2, reason: "retries exhausted after 2 attempts: gateway down")
  end

  it "lands a message past the broker's delivery limit in the DLQ, with the broker's reason readable" do
    AceMQ::AMQP::Topology.new.queue(queue, type: :quorum, arguments: { "x-delivery-limit" => 1 }).apply(mq)
    mq.publish({ "n" => 1 }, to: queue)
    # Given back unsettled as a consumer that dies holding it does, by its
    # channel closing: the broker counts each such return on every version
    # (a nack with requeue no longer counts on 4.3), and past the limit
    # dead-letters it itself.
    2.times do
      ch = @bunny.create_channel
      eventually { ch.basic_get(queue, manual_ack: true).first }
      ch.close
    end
    letter = eventually(timeout: 10) { mq.peek_dead_letters(queue, limit: 1).first }
    expect(letter.reason).to match(/dead-lettered by the broker: delivery_limit on #{queue}/)
    got = Queue.new
    sub = mq.consume("#{queue}.dlq") { |m| got << m; AceMQ::AMQP::Ack.accept }
    m = eventually { got.pop(true) rescue nil }
    expect(m.headers["x-death"].first).to include("reason" => "delivery_limit", "queue" => queue)
    expect(m.payload).to eq("n" => 1)
    sub.cancel
  end

  # x-delivery-count after giving a message back once by each way: what the
  # broker counts toward the limit, as measured on 3.10.8, 4.0.5 and 4.3.6.
  it "counts the returns this broker version counts" do
    AceMQ::AMQP::Topology.new.queue(queue, type: :quorum, arguments: { "x-delivery-limit" => 100 }).apply(mq)
    mq.publish({ "n" => 1 }, to: queue)
    count = lambda do
      ch = @bunny.create_channel
      _, props, = eventually { ch.basic_get(queue, manual_ack: true).then { |d, p, b| d && [d, p, b] } }
      ch.close # given back: counts everywhere
      (props[:headers] || {})["x-delivery-count"].to_i
    end
    given_back = lambda do |how|
      ch = @bunny.create_channel
      delivery, = eventually { ch.basic_get(queue, manual_ack: true).then { |d, p, b| d && [d, p, b] } }
      how == :nack ? ch.nack(delivery.delivery_tag, false, true) : ch.reject(delivery.delivery_tag, true)
      ch.close
    end
    before = count.call
    given_back.call(:reject)
    after_reject = count.call
    given_back.call(:nack)
    after_nack = count.call
    expect(after_reject - before).to eq(2) # the reject and count's own close
    expect(after_nack - after_reject).to eq(version >= Gem::Version.new("4.3") ? 1 : 2)
  end

  it "reads the broker's reason again when a replayed message is dead-lettered by the broker again" do
    AceMQ::AMQP::Topology.new.queue(queue, type: :quorum, arguments: { "x-delivery-limit" => 1 }).apply(mq)
    past_the_limit = lambda do
      2.times do
        ch = @bunny.create_channel
        eventually { ch.basic_get(queue, manual_ack: true).first }
        ch.close
      end
      eventually(timeout: 10) { mq.queue_counts("#{queue}.dlq")[:ready] == 1 }
    end
    mq.publish({ "n" => 1 }, to: queue)
    past_the_limit.call
    expect(mq.peek_dead_letters(queue, limit: 1).first.reason).to match(/by the broker: delivery_limit on #{queue}/)
    expect(mq.replay_dead_letters(queue).to_h).to eq(replayed: 1, skipped: 0)
    past_the_limit.call
    letter = mq.peek_dead_letters(queue, limit: 1).first
    expect(letter.reason).to match(/by the broker: delivery_limit on #{queue}/)
    expect(letter.attempt).to eq(1)
  end

  it "refuses to redeclare a classic queue as quorum, naming the argument" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    expect { AceMQ::AMQP::Topology.new.queue(queue, type: :quorum).apply(mq) }
      .to raise_error(AceMQ::AMQP::PreconditionFailed, /x-queue-type|x-dead-letter|x-delivery-limit/)
  end

  it "takes the type from the consumer class in the Rails DSL" do
    require "acemq/rails"
    klass = Class.new(AceMQ::Rails::Consumer) { def call(_m) = accept }
    klass.queue(queue, type: :quorum)
    klass.topology.apply(mq)
    klass.subscribe(mq).cancel
    expect(declared(queue).values.map(&:first).uniq).to eq(["quorum"])
  end
end
