# frozen_string_literal: true

require_relative "phase"

module Drill
  # h. Order per key across runners (issue 36), under the idempotent guard
  # (issue 49): a consumer partitioned 8 ways by account (queue.p0 …
  # queue.p7, each single active consumer), charging through the shipped
  # ActiveRecord store, three runners, 10,000 orders over 100 accounts
  # published in order, and kill -9 of the runner that is consuming while
  # one of its handlers is running, so it dies holding a claim. Every
  # account's orders must be charged in the order they were published,
  # counting every copy (the queue's, a redelivery, one back from the
  # ladder), none lost, none charged twice; the copies that went round the
  # ladder are counted, and the takeover (from the kill to the next charge
  # of each partition the dead runner was consuming) is measured.
  class PartitionOrder < Phase
    TITLE = "per-key order, 3 runners, kill -9"
    MESSAGES = Integer(ENV.fetch("DRILL_ORDER_MESSAGES", "10000"))
    KEYS = 100
    PARTITIONS = 8
    RUNNERS = 3
    # Each charge holds its transaction open this long, so a kill lands
    # inside a handler (its key claimed, its charge not committed).
    WORK = 0.01
    # DRILL_ORDER_WORKER_IDS=1: each runner's store gets a worker id of its
    # own instead of hostname:pid, so the dead runner's claims cannot be
    # proven dead (as for runners on other hosts): the new owner holds the
    # message in place until the claim expires (CLAIM_TIMEOUT).
    GIVEN_WORKERS = ENV["DRILL_ORDER_WORKER_IDS"] == "1"

    def run
      queue = "drill-#{tag}-order"
      charges, keys = db.charge_tables("drill_#{tag}_order")
      env = runner_env(queue: queue, origin: "drill-#{tag}-order", charges: charges, keys: keys,
                       extra: { "PARTITIONS" => PARTITIONS.to_s, "WORK_SECONDS" => WORK.to_s, "PREFETCH" => "20",
                                "POOL" => (PARTITIONS + 2).to_s, "LOG_DELIVERIES" => "1" })
      # One after another: the first to subscribe is each partition's active
      # consumer, the others wait behind it.
      RUNNERS.times do |i|
        spawn_runner(GIVEN_WORKERS ? env.merge("WORKER_ID" => "drill-order-runner-#{i}") : env).await_running
      end

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
      # In the middle of a handler: its key claimed, its charge not yet
      # committed. The kill then leaves a claim of a dead runner behind.
      # A handler that started under half its WORK ago is inside its
      # transaction: on a loaded machine one that started long ago may have
      # committed and be waiting for the GVL to log it.
      Drill.eventually(10, "runner #{victim.pid} to be in a handler", interval: 0.001) do
        t = Time.now.to_f
        in_flight(victim, with_times: true).any? { |_, started| t - started < WORK / 2 }
      end
      killed = Time.now.to_f
      victim.kill9
      result.faults = 1
      join(feed, 60, "publishing")
      await_charged(charges, ids, queue, limit: 60)
      Drill.eventually(20, "the partition queues to empty", interval: 0.3) { partitions_empty?(queue) }
      account(charges, ids, queue)
      dead = depths(queue).select { |name, _| name.end_with?(".dlq") }.sum { |_, (ready, _)| ready }
      fail!("#{dead} dead-lettered across the partitions") unless dead.zero?

      cut = in_flight(victim)
      fail!("the kill cut no handler: nothing tested the dead runner's claims") if cut.empty?
      # A cut handler had claimed its key; unless its commit landed as the
      # process died, that claim is the dead runner's, and the next owner
      # took it over (at once: its process had exited) or held the message
      # until it expired. (The guard claims before the handler logs its
      # start, so a claim can be taken over for an order no cut handler
      # shows; and on a loaded machine a cut handler may have committed
      # and not yet logged it.)
      others = @runners - [victim]
      taken = guard_lines(others, "taken_over")
      held = guard_lines(others, "held")
      again = cut & runs(others).map { |_, _, o, _| o }
      if (taken | held).empty?
        fail!("no claim of the dead runner was taken over or held: every handler the kill cut had committed")
      end
      unresolved = again - taken - held
      fail!("cut handlers run again with no takeover or hold of their claim: #{unresolved.join(', ')}") unless unresolved.empty?
      took = takeovers(killed, victim, others, queue)
      fail!("no other runner charged a partition of the dead runner after the kill") if took.empty?
      out_of_order, retried = order_breaks
      ladder = ladder_copies
      result.recovery = format("takeover %s", seconds(took.values))
      result.worst = took.values.max
      by_runner = @runners.map { |r| r.handled.count { |l| l.start_with?("charged ") } }
      result.notes = "#{KEYS} accounts over #{PARTITIONS} partitions, every copy checked: #{out_of_order.size} " \
                     "out of order; #{cut.size} handlers cut by the kill (#{cut.first(3).join(', ')}), " \
                     "#{again.size} of them run again; " \
                     "#{taken.size} claims of the dead runner taken over at once, #{held.size} held in place; " \
                     "#{ladder} copies round the ladder (#{retried} of them charged); " \
                     "takeover per partition #{took.map { |q, t| format('%s %.2fs', q.split('.').last, t) }.join(', ')}; " \
                     "charged per runner #{by_runner.join('/')}; #{reruns} re-run after the kill"
      fail!("#{out_of_order.size} orders charged before an earlier order of their account: #{out_of_order.first(5).join(', ')}") unless out_of_order.empty?

      stop_runners
    end

    private

    # A partitioned queue's parts (queue.pN, their rungs and DLQs): the
    # phase's queue name itself is never declared.
    def partitions_empty?(queue)
      depths(queue).reject { |name, _| name.end_with?(".dlq") }.values.all? { |ready, unacked| ready.zero? && unacked.zero? }
    end

    # Orders whose handler r started and had not finished (charged) when
    # last read: each holds its claim.
    def in_flight(r, with_times: false)
      started = {}
      done = {}
      r.handled.each do |line|
        what, order, t = line.split
        started[order] = Float(t) if what == "start"
        done[order] = true if what == "charged"
      end
      open = started.reject { |o, _| done[o] }
      with_times ? open : open.keys
    end

    # { partition queue => seconds from the kill to its next charge by
    # another runner }, for every partition the dead runner charged in its
    # last second (what it was consuming when it died).
    def takeovers(killed, victim, others, queue)
      part = ->(order) { AceMQ::AMQP.partition_queue(queue, order.split("-").first, PARTITIONS) }
      held = runs([victim]).select { |_, c, _, _| c > killed - 1 }.map { |_, _, o, _| part.(o) }
      held |= in_flight(victim).map(&part)
      after = runs(others).select { |s, _, _, _| s > killed }
      held.sort.filter_map do |q|
        first = after.select { |_, _, o, _| part.(o) == q }.map { |_, c, _, _| c }.min
        [q, first - killed] if first
      end.to_h
    end

    # Orders of the guard's `what` lines (taken_over, held) in runners' logs.
    def guard_lines(runners, what)
      runners.flat_map { |r| r.handled.grep(/\A#{what} /).map { |l| l.split[1] } }.uniq
    end

    # Copies of any order that came back from a rung of the ladder (a
    # retry, or a wait for a claim), as the guard's key function saw them.
    def ladder_copies
      @runners.sum { |r| r.handled.count { |l| l.start_with?("delivery ") && l.split[4] == "ladder" } }
    end

    # Orders charged before an earlier order of the same account, over
    # every copy that was charged (from the queue, redelivered, or back
    # from the ladder); and how many of the charged copies had been round
    # the ladder.
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
            retried += 1 if started.delete(order) == "retried"
            charged[order] = [charged[order], Float(t)].compact.min
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
