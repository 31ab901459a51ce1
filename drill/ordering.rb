# frozen_string_literal: true

require_relative "phase"

module Drill
  # h. Order per key across runners (issue 36): a consumer partitioned 8
  # ways by account (queue.p0 … queue.p7, each single active consumer),
  # three runners, 10,000 orders over 100 accounts published in order, and
  # kill -9 of the runner that is consuming, mid-run. Every account's orders
  # must be charged in the order they were published (leaving out the copies
  # that went round the retry ladder: a redelivery that waited out the dead
  # runner's claim), none lost, none charged twice; and the takeover (from
  # the kill to the first charge by another runner) is measured.
  class PartitionOrder < Phase
    TITLE = "per-key order, 3 runners, kill -9"
    MESSAGES = 10_000
    KEYS = 100
    PARTITIONS = 8
    RUNNERS = 3

    def run
      queue = "drill-#{tag}-order"
      charges, keys = db.charge_tables("drill_#{tag}_order")
      env = runner_env(queue: queue, origin: "drill-#{tag}-order", charges: charges, keys: keys,
                       extra: { "PARTITIONS" => PARTITIONS.to_s, "WORK_SECONDS" => "0", "PREFETCH" => "20",
                                "POOL" => (PARTITIONS + 2).to_s })
      # One after another: the first to subscribe is each partition's active
      # consumer, the others wait behind it.
      RUNNERS.times { spawn_runner(env).await_running }

      seq = Hash.new(0)
      all = Array.new(MESSAGES) do
        account = format("A%03d", rng.rand(KEYS))
        { "order_id" => format("%s-%05d", account, seq[account] += 1), "account_id" => account }
      end
      result.messages = all.size
      feed = Thread.new do
        Thread.current.report_on_exception = false
        deadline = Drill.now + 60
        all.each do |o|
          publisher.publish(o, to: queue, deadline: deadline, partition_key: o["account_id"], partitions: PARTITIONS)
        end
      end
      ids = all.map { |o| o["order_id"] }
      Drill.eventually(60, "a third of the orders charged") { db.charged(charges) >= MESSAGES / 3 }
      victim = @runners.max_by { |r| r.handled.size }
      killed = Time.now.to_f
      victim.kill9
      result.faults = 1
      join(feed, 60, "publishing")
      await_charged(charges, ids, queue, limit: 60)
      Drill.eventually(20, "the partition queues to empty", interval: 0.3) { partitions_empty?(queue) }
      account(charges, ids, queue)
      dead = depths(queue).select { |name, _| name.end_with?(".dlq") }.sum { |_, (ready, _)| ready }
      fail!("#{dead} dead-lettered across the partitions") unless dead.zero?

      takeover = back_at_work(killed, @runners - [victim])
      fail!("no other runner charged after the kill") unless takeover
      out_of_order, retried = order_breaks
      fail!("#{out_of_order.size} orders charged before an earlier order of their account: #{out_of_order.first(5).join(', ')}") unless out_of_order.empty?

      result.recovery = format("takeover %.2fs", takeover)
      result.worst = takeover
      by_runner = @runners.map { |r| r.handled.count { |l| l.start_with?("charged ") } }
      result.notes = "#{KEYS} accounts in order over #{PARTITIONS} partitions; #{retried} copies round the ladder " \
                     "left out; charged per runner #{by_runner.join('/')}; #{reruns} re-run after the kill"
      stop_runners
    end

    private

    # A partitioned queue's parts (queue.pN, their rungs and DLQs): the
    # phase's queue name itself is never declared.
    def partitions_empty?(queue)
      depths(queue).reject { |name, _| name.end_with?(".dlq") }.values.all? { |ready, unacked| ready.zero? && unacked.zero? }
    end

    # Orders charged before an earlier order of the same account, among the
    # copies that did not go round the ladder; and how many did.
    def order_breaks
      charged = {}
      retried = 0
      @runners.each do |r|
        started = {}
        r.handled.each do |line|
          what, order, t, note = line.split
          next unless t

          if what == "start"
            started[order] = note
          elsif what == "charged"
            note = started.delete(order)
            if note == "retried"
              retried += 1
            else
              charged[order] = Float(t)
            end
          end
        end
      end
      breaks = []
      charged.keys.group_by { |o| o.split("-").first }.each_value do |orders|
        by_time = orders.sort_by { |o| charged[o] }
        by_time.each_cons(2) { |a, b| breaks << "#{b} before #{a}" if b.split("-").last < a.split("-").last }
      end
      [breaks, retried]
    end
  end
end
