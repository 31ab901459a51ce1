# frozen_string_literal: true

require "bunny"
require "acemq/status"

# Looking at a quorum DLQ never loses a dead letter, on RabbitMQ 3.10, 4.0
# and 4.3. Peeking reads each message unacknowledged and gives it back,
# which counts toward a quorum queue's delivery limit on 3.10 and 4.0; a DLQ
# has no dead-letter target, so past its limit the broker drops the message.
# RabbitMQ 4.x gives a quorum queue declared without a limit 20, and 4.3
# moves a message it dead-lettered for its delivery limit into the DLQ with
# its count already past 20. `acemq status` peeks on every call, and a
# filtered replay gives back what it skips. AceMQ declares a quorum DLQ with
# a limit of a billion, keeps one that exists without it (an older AceMQ's),
# and puts a dead letter whose count nears a limit back at the DLQ's tail as
# a fresh copy (replay.rs, REFRESH_AT). Both kinds of DLQ are read here more
# than 25 times, through peek, status and filtered replay.
RSpec.describe "reading a quorum DLQ" do
  let(:queue) { unique("dlq-read") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }

  before(:all) { @bunny = Bunny.new(AMQP_URL, logger: Logger.new(nil)).tap(&:start) }
  after(:all) { @bunny.close }
  after { mq.close }

  def topology = AceMQ::AMQP::Topology.new.queue(queue, type: :quorum)

  # Two that AceMQ dead-letters (Ack.reject), and one the broker
  # dead-letters for the main queue's delivery limit (AceMQ's 20): rejected
  # with requeue 21 times, which counts on every version measured.
  def fill_dlq
    sub = mq.consume(queue) { |m| AceMQ::AMQP::Ack.reject("declined #{m.payload['n']}") }
    ids = [0, 1].map { |n| mq.publish({ "n" => n }, to: queue).id }
    eventually(timeout: 10) { sub.stats[:dead_lettered] == 2 }
    sub.cancel
    ids << mq.publish({ "n" => 2 }, to: queue).id
    ch = @bunny.create_channel
    21.times do
      delivery, = eventually { ch.basic_get(queue, manual_ack: true).then { |d, _, _| d } }
      ch.reject(delivery.delivery_tag, true)
    end
    ch.close
    eventually(timeout: 10) { mq.queue_counts("#{queue}.dlq")[:ready] == 3 }
    ids.sort
  end

  def ids_peeked = mq.peek_dead_letters(queue, limit: 100).map(&:id).sort

  def read_it_all_over_and_over(ids)
    30.times { |i| expect(ids_peeked).to eq(ids), -> { "peek #{i + 1}: #{mq.peek_dead_letters(queue, limit: 100).inspect}" } }
    broker = mq.peek_dead_letters(queue, limit: 100).find { |d| d.reason&.start_with?("dead-lettered by the broker") }
    expect(broker.reason).to match(/delivery_limit on #{queue}/)
    status = AceMQ::Status.new(connection: mq, targets: [AceMQ::Status.target(queue)], interval: 0)
    # Each collect peeks as many as the broker counts ready, a count that
    # catches up with the last read's give-back a moment after it.
    5.times { eventually { status.collect[:consumers].first[:dlq].then { |d| d[:ready] == 3 && d[:newest].size == 3 } } }
    5.times { expect(mq.replay_dead_letters(queue, reason: "no reason like this").to_h).to eq(replayed: 0, skipped: 3) }
    expect(ids_peeked).to eq(ids)
    expect(mq.replay_dead_letters(queue, reason: "declined 0").to_h).to eq(replayed: 1, skipped: 2)
    expect(ids_peeked.size).to eq(2)
    # The broker's ready count catches up with the give-back a moment later.
    eventually { mq.queue_counts("#{queue}.dlq")[:ready] == 2 }
  end

  it "loses none from the DLQ AceMQ declares (delivery limit a billion)" do
    topology.apply(mq)
    read_it_all_over_and_over(fill_dlq)
  end

  it "loses none from a DLQ declared before AceMQ set its limit (4.x's default 20), which it keeps as it is" do
    ch = @bunny.create_channel
    ch.queue("#{queue}.dlq", durable: true, arguments: { "x-queue-type" => "quorum" })
    ch.close
    expect { topology.apply(mq) }.not_to raise_error
    read_it_all_over_and_over(fill_dlq)
  end

  # A replay reads what the DLQ held when it started (issue 48): with a
  # handler that still fails, each copy it sends is back in the DLQ while it
  # runs, and a replay that read on to the DLQ's end replayed those again
  # (300 dead letters: replay_dead_letters had not returned after 120 s).
  # Each is replayed once, the count is the DLQ's, and it returns at once;
  # the copies that failed again wait for the next replay.
  it "replays each of a DLQ of 300 once when the handler still fails, and returns promptly" do
    topology.apply(mq)
    seen = Hash.new(0)
    lock = Mutex.new
    sub = mq.consume(queue) do |m|
      lock.synchronize { seen[m.id] += 1 }
      AceMQ::AMQP::Ack.reject("still declined #{m.payload['n']}")
    end
    ids = Array.new(300) { |n| mq.publish({ "n" => n }, to: queue).id }
    eventually(timeout: 30) { mq.queue_counts("#{queue}.dlq")[:ready] == 300 }
    lock.synchronize { seen.clear }
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    report = Timeout.timeout(60) { mq.replay_dead_letters(queue) }
    took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    expect(report.to_h).to eq(replayed: 300, skipped: 0)
    expect(took).to be < 30
    eventually(timeout: 30) { mq.queue_counts("#{queue}.dlq")[:ready] == 300 }
    sleep 0.3
    sub.cancel
    counts = lock.synchronize { seen.dup }
    expect(counts.keys.sort).to eq(ids.sort)
    expect(counts.values.uniq).to eq([1])
    expect(mq.queue_counts("#{queue}.dlq")[:ready]).to eq(300)
    again = mq.peek_dead_letters(queue, limit: 1).first
    expect(again.history.last["reason"]).to start_with("still declined")
    expect(again.headers["x-acemq-replayed-by"]).to be_a(String)
  ensure
    sub&.cancel
  end

  it "still refuses to turn a classic queue and its DLQ into quorum ones, naming the argument" do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    expect { topology.apply(mq) }.to raise_error(AceMQ::AMQP::PreconditionFailed, /x-queue-type/)
  end
end
