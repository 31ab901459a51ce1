# frozen_string_literal: true

# Issue 48: how many a replay sends, and how often the handler runs, when
# the handler still fails every message. Not a speed: a count, printed for
# each way of replaying. The issue's figure was "Replayed 20,315" for a DLQ
# of 300 in queue mode; a replay must send each dead letter once.
#
#   ruby bench/replay_counts.rb        # RabbitMQ on AMQP_URL, PostgreSQL on BENCH_PG_URL
#
# BENCH_REPLAY_N (default 300, and 3,000 after it): the DLQ's size. For each:
#   queue mode   mq.replay_dead_letters(q) on the DLQ itself
#   store mode   the DLQ ingested into SQLDeadLetterStore on PostgreSQL, then
#                store.replay(mq, queue:, rate: 10_000)
# with the handler failing each copy again (max_attempts 1, so straight to
# the DLQ) and an ingester running during the store replay, as in the runner.

require_relative "common"
require "pg"

module ReplayCounts
  C = BenchCommon
  include AceMQ::AMQP

  def self.wait_until(seconds)
    deadline = C.now + seconds
    sleep 0.05 until yield || C.now > deadline
    raise "not within #{seconds} s" unless yield
  end

  # The queue and its ladder, deleted through Bunny.
  def self.delete(queue)
    bunny = Bunny.new(C::URL).tap(&:start)
    C.delete_queues(bunny, bunny.create_channel, [queue, "#{queue}.dlq", *C.queues_named("#{queue}.retry")])
    bunny.close
  end

  def self.fill(mq, queue, n)
    n.times { |i| mq.publish({ "n" => i }, to: queue) }
    wait_until(120) { mq.queue_counts("#{queue}.dlq")&.fetch(:ready) == n }
  end

  # Run the handler (which always fails) until the DLQ holds n again; the
  # number of handler runs so far.
  def self.failing_consumer(mq, queue, runs)
    mq.consume(queue, retries: { max_attempts: 1 }) do |_m|
      runs.increment
      Ack.reject("still failing")
    end
  end

  Counter = Struct.new(:value) do
    def increment = (@lock ||= Mutex.new).synchronize { self.value += 1 }
  end

  def self.queue_mode(mq, n)
    queue = "bench.replay.q.#{SecureRandom.hex(4)}"
    Topology.new.queue(queue).apply(mq)
    runs = Counter.new(0)
    sub = failing_consumer(mq, queue, runs)
    fill(mq, queue, n)
    before = runs.value
    t = C.now
    report = mq.replay_dead_letters(queue)
    wait_until(120) { mq.queue_counts("#{queue}.dlq")&.fetch(:ready) == n && mq.queue_counts(queue)&.fetch(:ready).zero? }
    sleep 0.5 # a copy sent twice would show here
    { mode: "queue mode", n: n, replayed: report.replayed, runs: runs.value - before, dlq: mq.queue_counts("#{queue}.dlq")[:ready],
      seconds: C.now - t }
  ensure
    sub&.cancel
    delete(queue) if queue
  end

  def self.store_mode(mq, n)
    queue = "bench.replay.s.#{SecureRandom.hex(4)}"
    Topology.new.queue(queue).apply(mq)
    db = PG.connect(C::PG_URL)
    db.set_notice_processor { |_| }
    table = "bench_replay_#{SecureRandom.hex(4)}"
    # A connection per thread (the ingester's, this one's): SQLDeadLetterStore.open.
    store = SQLDeadLetterStore.open(C::PG_URL, table: table, audit_table: "#{table}_audit")
    store.create_schema
    runs = Counter.new(0)
    sub = failing_consumer(mq, queue, runs)
    fill(mq, queue, n)
    ingester = store.ingest(mq, queue)
    wait_until(120) { store.counts(queue: queue)[:total] == n }
    before = runs.value
    t = C.now
    report = store.replay(mq, queue: queue, actor: "bench", rate: 10_000)
    wait_until(120) { runs.value - before >= report[:replayed] && store.counts(queue: queue)[:total] == n }
    sleep 0.5
    { mode: "store mode", n: n, replayed: report[:replayed], runs: runs.value - before, dlq: store.counts(queue: queue)[:total],
      seconds: C.now - t }
  ensure
    ingester&.stop
    sub&.cancel
    delete(queue) if queue
    db&.exec("DROP TABLE IF EXISTS #{table}; DROP TABLE IF EXISTS #{table}_audit") if table
    db&.close
  end

  def self.run
    mq = Connection.open(C::URL)
    sizes = ENV["BENCH_REPLAY_N"] ? [Integer(ENV["BENCH_REPLAY_N"])] : [300, 3000]
    puts format("%-11s %6s %9s %13s %12s %8s", "", "DLQ", "replayed", "handler runs", "DLQ after", "seconds")
    sizes.each do |n|
      [queue_mode(mq, n), store_mode(mq, n)].each do |r|
        puts format("%-11s %6d %9d %13d %12d %8.1f", r[:mode], r[:n], r[:replayed], r[:runs], r[:dlq], r[:seconds])
      end
    end
  ensure
    mq&.close
  end
end

ReplayCounts.run if $PROGRAM_NAME == __FILE__
