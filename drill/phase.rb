# frozen_string_literal: true

module Drill
  # One line of the summary: what a phase did and what it found.
  # worst: the longest recovery in seconds (nil where the phase has none).
  Result = Struct.new(:phase, :messages, :faults, :lost, :doubled, :wire_dups, :recovery, :worst, :seconds, :failure,
                      :notes, keyword_init: true) do
    def ok? = failure.nil?
  end

  # What every phase needs: the private node, the database, a publisher,
  # runners charging through the shipped store, and the accounting.
  class Phase
    attr_reader :node, :db, :rng, :tag

    def initialize(node:, db:, rng:, tag:)
      @node = node
      @db = db
      @rng = rng
      @tag = tag
      @runners = []
    end

    # Run the phase; always returns a Result (a failure is recorded in it).
    def call
      t = Drill.now
      @result = Result.new(phase: self.class::TITLE, faults: 0, lost: 0, doubled: 0)
      begin
        run
      rescue Failure, AceMQ::AMQP::Error, PG::Error, Bunny::Exception => e
        @result.failure = "#{e.class.name.split('::').last}: #{e.message}"
      rescue StandardError => e
        # Not a finding of the drill's but a fault in it (or a library
        # that does not load): still a failure, with where it happened.
        @result.failure = "#{e.class}: #{e.message} (at #{e.backtrace&.first})"
      ensure
        @result.seconds = Drill.now - t
        teardown
      end
      @result
    end

    private

    def result = @result

    def fail!(message) = raise(Failure, message)

    def publisher
      @publisher ||= Publisher.new(node.url, "drill-#{tag}-publisher")
    end

    def declare(topology) = topology.apply(publisher.mq)

    def runner_env(queue:, origin:, charges:, keys:, extra: {})
      { "AMQP_URL" => node.url, "QUEUE" => queue, "ORIGIN" => origin, "DATABASE_URL" => DATABASE_URL,
        "CHARGES_TABLE" => charges, "IDEMPOTENCY_TABLE" => keys, "CLAIM_TIMEOUT" => CLAIM_TIMEOUT.to_s,
        "WORK_SECONDS" => WORK_SECONDS.to_s }.merge(extra)
    end

    def spawn_runner(env)
      r = Runner.spawn(env)
      @runners << r
      r
    end

    # Every runner this phase started and that still runs, stopped with
    # TERM; a runner that does not drain and exit 0 is a finding.
    def stop_runners
      live = @runners.reject(&:exited?)
      statuses = live.map { |r| [r, r.stop] }
      bad = statuses.reject { |_, s| s.zero? }
      return if bad.empty?

      fail!("runner(s) did not stop cleanly on TERM: " +
            bad.map { |r, s| "pid #{r.pid} exited #{s}: #{r.text.lines.last(5).join.strip}" }.join("; "))
    end

    def teardown
      @runners.each do |r|
        unless r.exited?
          Process.kill("KILL", r.pid)
          r.process.wait(5)
        end
        Children.forget(r.pid)
        r.cleanup
      rescue Errno::ESRCH
        nil
      end
      @publisher&.close
    end

    # Queues of the phase (the queue, its rungs, its DLQ): name => [ready, unacked].
    def depths(queue)
      node.queues("name", "messages_ready", "messages_unacknowledged")
          .select { |name, _, _| name == queue || name.start_with?("#{queue}.") }
          .to_h { |name, ready, unacked| [name, [Integer(ready), Integer(unacked)]] }
    end

    # Wait until nothing is ready or unacknowledged on the queue and its
    # rungs (a retry waiting out a claim comes back from its rung, finds the
    # key confirmed and is accepted unrun). The DLQ is left for the caller.
    def settle(queue, limit: 30)
      last = nil
      Drill.eventually(limit, "#{queue} and its rungs to empty (last: #{last.inspect})", interval: 0.3) do
        last = depths(queue).reject { |name, _| name.end_with?(".dlq") }
        last.values.all? { |ready, unacked| ready.zero? && unacked.zero? }
      end
    rescue Failure
      fail!("#{queue} did not settle within #{limit}s: #{depths(queue).inspect}")
    end

    # Wait for every order to be charged; a timeout says how many are
    # missing and where the queues stand.
    def await_charged(charges, orders, queue, limit: 60)
      Drill.eventually(limit, "charges") { db.charged(charges) >= orders.size }
    rescue Failure
      missing = orders - db.charge_counts(charges).keys
      # Not charged in time is not yet known to be lost: the summary says "?".
      result.lost = nil
      result.doubled = nil
      fail!("#{missing.size} of #{orders.size} orders never charged within #{limit}s (first: " \
            "#{missing.first(5).join(', ')}); queues: #{depths(queue).inspect}#{dlq_reasons(queue)}")
    end

    # The accounting every phase ends with: each order charged exactly once,
    # nothing in the DLQ.
    def account(charges, orders, queue)
      counts = db.charge_counts(charges)
      missing = orders - counts.keys
      doubled = counts.select { |_, n| n > 1 }
      strangers = counts.keys - orders
      result.lost = missing.size
      result.doubled = doubled.size
      dlq = depths(queue)["#{queue}.dlq"]&.first.to_i
      problems = []
      problems << "#{missing.size} lost (#{missing.first(5).join(', ')})" unless missing.empty?
      problems << "#{doubled.size} charged twice or more (#{doubled.first(5).map { |o, n| "#{o}×#{n}" }.join(', ')})" unless doubled.empty?
      problems << "#{strangers.size} charges for orders never published (#{strangers.first(5).join(', ')})" unless strangers.empty?
      problems << "#{dlq} dead-lettered#{dlq_reasons(queue)}" unless dlq.zero?
      fail!(problems.join("; ")) unless problems.empty?
    end

    def dlq_reasons(queue)
      letters = publisher.mq.peek_dead_letters(queue, limit: 3)
      letters.empty? ? "" : " (DLQ: #{letters.map(&:reason).uniq.join(' | ')})"
    rescue AceMQ::AMQP::Error => e
      " (DLQ unreadable: #{e.message})"
    end

    # [[start wall time, charged wall time, order, pid]] for every handler
    # run that charged, from every runner's log.
    def runs(runners = @runners)
      runners.flat_map do |r|
        started = {}
        r.handled.filter_map do |line|
          what, order, t = line.split
          next unless t

          if what == "start"
            started[order] = Float(t)
            nil
          elsif what == "charged" && started[order]
            [started.delete(order), Float(t), order, r.pid]
          end
        end
      end
    end

    # Seconds from wall time t to the first charge by a handler that started
    # after t: how long the consumers took to be back at work.
    def back_at_work(t, runners = @runners)
      first = runs(runners).select { |s, _, _, _| s > t }.map { |_, c, _, _| c }.min
      first && first - t
    end

    # back_at_work, waited for; a timeout shows what the runners said.
    def await_back(t, limit, after, runners = @runners)
      Drill.eventually(limit, "a charge after #{after}") { back_at_work(t, runners) }
    rescue Failure => e
      said = @runners.reject(&:exited?).map do |r|
        "runner #{r.pid}: #{r.text.lines.last(6).map(&:strip).join(' / ')}; last handled: #{r.handled.last(2).join(' / ')}"
      end
      fail!("#{e.message} at #{format('%.3f', t)}; #{said.join('; ')}")
    end

    # Handler runs per order (more than one: a run that was killed or cut
    # off before its commit, then run again).
    def reruns(runners = @runners)
      runners.flat_map { |r| r.handled.grep(/\Astart /).map { |l| l.split[1] } }.tally.count { |_, n| n > 1 }
    end

    # Sleep until offset seconds after t0 (pacing the faults, not waiting for
    # a condition), then check the feed is still publishing: a fault after
    # the last message would measure nothing.
    def at(t0, offset, feed)
      ahead = t0 + offset - Drill.now
      sleep ahead if ahead.positive?
      fail!("mis-paced: publishing ended before the fault at #{offset}s (raise MESSAGES or lower RATE)") unless feed.alive?
    end

    def orders(prefix, n) = Array.new(n) { |i| format("%s-%05d", prefix, i + 1) }

    def seconds(xs)
      xs = xs.compact
      return "-" if xs.empty?

      xs.size == 1 ? format("%.2fs", xs.first) : format("max %.2fs (median %.2fs)", xs.max, xs.sort[xs.size / 2])
    end

    def join(thread, limit, what)
      return thread.value if thread.join(limit)

      thread.kill
      fail!("#{what} did not finish within #{limit}s")
    end
  end
end
