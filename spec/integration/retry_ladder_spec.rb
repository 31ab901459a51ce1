# frozen_string_literal: true

require "bunny"
require "rbconfig"

RSpec.describe "the retry ladder and the DLQ on RabbitMQ" do
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:queue) { unique("ladder") }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
  after { mq.close }

  def bunny
    @bunny ||= Bunny.new(AMQP_URL, logger: Logger.new(nil)).tap(&:start)
  end

  after { @bunny&.close }

  def depth(name)
    ch = bunny.create_channel
    ch.queue(name, passive: true, durable: true).message_count
  ensure
    ch&.close
  end

  it "declares one rung per distinct delay, each a queue-level TTL back to the queue" do
    sub = mq.consume(queue, retries: { max_attempts: 6, initial_delay: 1, max_delay: 4 }) { AceMQ::AMQP::Ack.accept }
    %w[1s 2s 4s].each { |d| expect(depth("#{queue}.retry.#{d}")).to eq(0) }
    expect { bunny.create_channel.queue("#{queue}.retry.8s", passive: true, durable: true) }.to raise_error(Bunny::NotFound)
    sub.cancel
  end

  it "never loses a message when the consumer dies between the copy and the ack" do
    mq.publish({ "order_id" => "K-1" }, to: queue)
    script = <<~RUBY
      $LOAD_PATH.unshift(#{File.expand_path('../../lib', __dir__).inspect})
      require "acemq/amqp"
      mq = AceMQ::AMQP::Connection.open(#{AMQP_URL.inspect})
      mq.consume(#{queue.inspect}, retries: { max_attempts: 3, initial_delay: 0.3, max_delay: 0.3 }) do
        AceMQ::AMQP::Ack.retry("try again")
      end
      sleep 20
    RUBY
    pid = Process.spawn({ "ACEMQ_FAULT_INJECT" => "exit-after-copy" }, RbConfig.ruby, "-e", script)
    _, status = Process.wait2(pid)
    expect(status.exitstatus).to eq(86) # it died in the window, as arranged
    # The original went back to the queue unacked; the copy waits in the rung
    # and then comes back too: a duplicate, never a loss.
    seen = Queue.new
    sub = mq.consume(queue) { |m| seen << [m.envelope.id, m.envelope.attempt, m.delivery.redelivered?]; AceMQ::AMQP::Ack.accept }
    got = Array.new(2) { eventually(timeout: 5) { seen.pop(true) rescue nil } }
    sub.cancel
    expect(got.map(&:first).uniq.size).to eq(1)
    expect(got.map { |_, attempt, _| attempt }.sort).to eq([1, 2])
    expect(got.find { |_, attempt, _| attempt == 1 }[2]).to be(true) # the original, redelivered
  end

  it "declares the DLQ again when somebody deleted it, rather than acking a reject into nothing" do
    gate = Queue.new
    sub = mq.consume(queue) { |_m| gate.pop; AceMQ::AMQP::Ack.reject("bad payload") }
    mq.publish({ "x" => 1 }, to: queue)
    eventually { depth(queue).zero? } # delivered, waiting at the gate
    bunny.create_channel.queue_delete("#{queue}.dlq")
    gate << :go
    eventually { sub.stats[:dead_lettered] == 1 }
    sub.cancel
    expect(depth("#{queue}.dlq")).to eq(1)
  end

  it "refuses a redeclaration with other arguments, naming the argument, and deletes nothing" do
    ch = bunny.create_channel
    other = unique("other")
    ch.queue(other, durable: true, arguments: { "x-message-ttl" => 60_000 })
    ch.default_exchange.publish("{}", routing_key: other)
    eventually { depth(other) == 1 }
    expect { AceMQ::AMQP::Topology.new.queue(other, arguments: { "x-message-ttl" => 1000 }).apply(mq) }
      .to raise_error(AceMQ::AMQP::PreconditionFailed, /x-message-ttl.*never deletes/)
    expect(depth(other)).to eq(1)
    ch.queue_delete(other)
  end

  it "reports a copy the broker refuses through on_error and puts the message back, unlost" do
    errors = Queue.new
    sub = mq.consume(queue, on_error: ->(e) { errors << e }) { AceMQ::AMQP::Ack.reject("bad") }
    # Somebody replaced the DLQ with one that refuses everything.
    ch = bunny.create_channel
    ch.queue_delete("#{queue}.dlq")
    ch.queue("#{queue}.dlq", durable: true, arguments: { "x-max-length" => 0, "x-overflow" => "reject-publish" })
    mq.publish({ "x" => 1 }, to: queue)
    error = eventually(timeout: 5) { errors.pop(true) rescue nil }
    sub.cancel
    expect(error).to be_a(AceMQ::AMQP::PublishNacked)
    expect(error.message).to include("#{queue}.dlq", "put back on #{queue}")
    eventually { depth(queue) == 1 }
    expect(depth("#{queue}.dlq")).to eq(0)
  end

  it "replays dead letters with the attempt reset and the reason kept as history" do
    sub = mq.consume(queue, retries: { max_attempts: 1 }) do |m|
      m.payload["n"].even? ? AceMQ::AMQP::Ack.reject("card declined") : AceMQ::AMQP::Ack.reject("gateway down")
    end
    4.times { |n| mq.publish({ "n" => n }, to: queue, type: "payment.v1") }
    eventually { sub.stats[:dead_lettered] == 4 }
    sub.cancel
    expect(mq.replay_dead_letters(queue, reason: "gateway").to_h).to eq(replayed: 2, skipped: 2)
    expect(depth("#{queue}.dlq")).to eq(2)
    seen = Queue.new
    sub = mq.consume(queue) { |m| seen << m; AceMQ::AMQP::Ack.accept }
    back = Array.new(2) { eventually { seen.pop(true) rescue nil } }
    sub.cancel
    expect(back.map { |m| m.payload["n"] }.sort).to eq([1, 3])
    expect(back.map(&:attempt)).to eq([1, 1])
    expect(back.first.headers["x-acemq-history"].first).to include("reason" => "gateway down")
    expect { mq.replay_dead_letters(queue, limit: 0) }.to raise_error(AceMQ::AMQP::ConfigurationError)
  end
end
