# frozen_string_literal: true

require "acemq/amqp/patterns"
require "tmpdir"
require "bunny"
require "logger"

# Two timeouts bound a handler: its own deadline (timeout:), which the
# engine keeps, and the broker's consumer_timeout, which closes the whole
# channel. The first must come first. And an idempotent consumer's
# redelivery that finds its key claimed waits for the claim without
# spending attempts, so the ladder can never run out before the claim does.
RSpec.describe "handler deadlines and claim waits, on RabbitMQ" do
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:queue) { unique("deadline") }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
  after { mq.close }
  after { @bunny&.close }

  def depth(name)
    @bunny ||= Bunny.new(AMQP_URL, logger: Logger.new(nil)).tap(&:start)
    ch = @bunny.create_channel
    ch.queue(name, passive: true, durable: true).message_count
  ensure
    ch&.close
  end

  it "retries a delivery whose handler runs past its timeout, discards its late result, and keeps consuming" do
    seen = Queue.new
    release = Queue.new
    errors = Queue.new
    sub = mq.consume(queue, timeout: 0.5, retries: { max_attempts: 3, initial_delay: 0.2 },
                            on_error: ->(e) { errors << e }) do |m|
      seen << [m.payload["n"], m.envelope.attempt]
      release.pop if m.payload["slow"] && m.envelope.attempt == 1 # hangs until the example lets it go
      AceMQ::AMQP::Ack.accept
    end
    mq.publish({ "n" => 1 }, to: queue)
    mq.publish({ "n" => 2, "slow" => true }, to: queue)
    mq.publish({ "n" => 3 }, to: queue)
    got = Array.new(4) { eventually(timeout: 10) { seen.pop(true) rescue nil } }
    # concurrency 1, and the message behind the hung one still runs: the
    # hung thread was replaced; the hung message came back as attempt 2.
    expect(got).to contain_exactly([1, 1], [2, 1], [3, 1], [2, 2])
    expect(sub.overdue).to eq(1)
    release << :go # the late handler returns; its accept must be discarded
    eventually { sub.stats[:abandoned] == 1 }
    expect(sub.stats).to include(accepted: 3, retried: 1, timed_out: 1, abandoned: 1)
    eventually { sub.overdue.zero? }
    expect(sub.failure).to be_nil # the channel was never closed
    expect(errors.size).to eq(0)
    sub.cancel
    expect(depth(queue)).to eq(0) # nothing was left unsettled to go back
    expect(depth("#{queue}.dlq")).to eq(0)
  end

  it "refuses a timeout the broker's consumer_timeout or the idempotency claim would cut short, naming both" do
    # RabbitMQ 4.3 applies consumer_timeout to quorum queues only
    # (docs/production.md): there a classic queue's consumer is not held to
    # it, and a quorum queue's is.
    if Gem::Version.new(mq.server_version) >= Gem::Version.new("4.3")
      expect(mq.consume(queue, timeout: 3600) { AceMQ::AMQP::Ack.accept }.cancel).to be_cancelled
      quorum = unique("deadline-quorum")
      AceMQ::AMQP::Topology.new.queue(quorum, type: :quorum).apply(mq)
      expect { mq.consume(quorum, timeout: 3600) { AceMQ::AMQP::Ack.accept } }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /timeout \(60m\).*consumer_timeout \(30m\)/)
    else
      expect { mq.consume(queue, timeout: 3600) { AceMQ::AMQP::Ack.accept } }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /timeout \(60m\).*consumer_timeout \(30m\)/)
    end
    expect(mq.consume(queue, timeout: 3600, consumer_timeout: 7200) { AceMQ::AMQP::Ack.accept }.cancel).to be_cancelled
    store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new(claim_timeout: 60)
    guarded = AceMQ::AMQP::Patterns.idempotent(store) { AceMQ::AMQP::Ack.accept }
    expect { mq.consume(queue, timeout: 120, &guarded) }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /timeout \(2m\).*claim_timeout \(1m\)/)
    sub = mq.consume(queue, &guarded) # unnamed, the deadline is the claim's
    expect(sub.timeout).to eq(60.0)
    sub.cancel
  end

  it "warns when a consumer has no retries to wait on for a claimed key" do
    warned = Queue.new
    store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new(claim_timeout: 60)
    sub = mq.consume(queue, retries: { max_attempts: 1 }, on_error: ->(e) { warned << e },
                            &AceMQ::AMQP::Patterns.idempotent(store) { AceMQ::AMQP::Ack.accept })
    w = warned.pop(true)
    expect(w).to be_a(AceMQ::AMQP::ConfigurationWarning)
    expect(w.message).to include("max_attempts 1", "allow retries")
    sub.cancel
  end

  it "lets a message whose key a crashed process claimed wait for the claim, spending no attempts, and then run once" do
    Dir.mktmpdir do |dir|
      path = File.join(dir, "keys.db")
      store = AceMQ::AMQP::Patterns::SQLIdempotencyStore.new(path: path, claim_timeout: 3)
      store.create_schema
      # Another process claims the key and dies before it confirms. Its
      # worker id names another host: a dead worker of this host (hostname:pid,
      # the pid gone) has its claim taken over at once (docs/ordering.md);
      # one elsewhere cannot be proven dead and is waited out.
      pid = fork do
        crashed = AceMQ::AMQP::Patterns::SQLIdempotencyStore.new(path: path, claim_timeout: 3, worker: "another-host:4242")
        exit!(crashed.first_time?("order-1") ? 0 : 1)
      end
      Process.wait(pid)
      expect($?.exitstatus).to eq(0)

      ran = Queue.new
      # Two attempts of 0.2 s: before, the ladder ran out in 0.2 s, long
      # before the 3 s claim, and the message was dead-lettered unrun.
      sub = mq.consume(queue, retries: { max_attempts: 2, initial_delay: 0.2 },
                              &AceMQ::AMQP::Patterns.idempotent(store) { |m| ran << m.envelope.attempt; AceMQ::AMQP::Ack.accept })
      mq.publish({ "n" => 1 }, to: queue, envelope: AceMQ::AMQP::Envelope.new(id: "order-1"))
      mq.publish({ "n" => 2 }, to: queue, envelope: AceMQ::AMQP::Envelope.new(id: "order-2")) # a good one behind it is not held up
      first = eventually(timeout: 5) { ran.pop(true) rescue nil }
      expect(first).to eq(1) # order-2
      attempt = eventually(timeout: 10) { ran.pop(true) rescue nil }
      expect(attempt).to eq(1) # order-1, run once the claim expired, on its first attempt
      expect(sub.stats[:waited]).to be >= 2
      # The handler reports before it returns: its accept is counted just after.
      eventually(timeout: 5) { sub.stats[:accepted] == 2 }
      expect(sub.stats).to include(accepted: 2, dead_lettered: 0)
      expect(store.confirmed?("order-1")).to be(true)
      sub.cancel
      expect(depth("#{queue}.dlq")).to eq(0)
      expect(depth(queue)).to eq(0)
    end
  end
end
