# frozen_string_literal: true

require_relative "phase"

module Drill
  # a. Runners killed with SIGKILL while they charge. What the dead one had
  # taken and not acknowledged goes back to the queue; its claims go stale
  # after CLAIM_TIMEOUT and are taken over; what it had committed is
  # confirmed and is accepted unrun.
  class KillRunners < Phase
    TITLE = "kill -9 runners"
    MESSAGES = 2000
    RUNNERS = 3
    KILLS = 6
    # Messages a second until the last kill (then the rest at once): slow
    # enough that the publishing outlasts the kills on a busy machine.
    RATE = 150

    def run
      queue = "drill-#{tag}-kill"
      origin = "drill-#{tag}-kill"
      charges, keys = db.charge_tables("drill_#{tag}_kill")
      declare(AceMQ::AMQP::Topology.new.queue(queue))
      env = ->(i) { runner_env(queue: queue, origin: "#{origin}-#{i}", charges: charges, keys: keys) }
      RUNNERS.times { |i| spawn_runner(env.call(i)) }
      @runners.each(&:await_running)

      all = orders("K", MESSAGES)
      result.messages = all.size
      t0 = Drill.now
      feed = publisher.pace(all, to: queue, rate: RATE, deadline: Drill.now + 60)
      victims = []
      KILLS.times do |k|
        at(t0, 0.8 + k, feed)
        # Two running at least, so one is left consuming: on a busy machine
        # a replacement can take longer to boot than the kills are apart.
        live = Drill.eventually(30, "two runners running to choose a victim from") do
          up = @runners.reject(&:exited?).select(&:running?)
          up.size >= 2 && up
        end
        victim = live.sample(random: rng)
        wall = Time.now.to_f
        victim.kill9
        victims << [victim, wall]
        spawn_runner(env.call(RUNNERS + k))
      end
      result.faults = victims.size
      publisher.hurry
      join(feed, 60, "publishing")
      await_charged(charges, all, queue)
      settle(queue)
      account(charges, all, queue)

      # Takeover: for each kill, how long until every order the dead runner
      # had started and not committed was charged by somebody else.
      times = db.charge_times(charges)
      takeovers = victims.map do |victim, wall|
        cut = victim.handled.grep(/\Astart /).map { |l| l.split[1] }.uniq.select { |o| times.fetch(o) > wall }
        cut.map { |o| times.fetch(o) - wall }.max
      end
      result.recovery = "takeover #{seconds(takeovers)} (#{takeovers.compact.size} kills cut a handler)"
      result.worst = takeovers.compact.max
      result.notes = "#{reruns} re-run after a kill, #{publisher.retries} publish retries"
      stop_runners
    end
  end

  # b. The broker closes the runners' connections (found by the name each
  # connection carries: the origin). Subscriptions subscribe again by
  # themselves; what was in flight is redelivered.
  class CloseConnections < Phase
    TITLE = "broker closes connections"
    # Paced, 4000 would take 31 s; the faults are over in a few seconds on
    # an idle machine and the rest is published unpaced (hurry). The length
    # is for a loaded machine, where each recovery is waited out before the
    # next fault and a shorter feed could end first.
    MESSAGES = 4000
    RUNNERS = 2
    CLOSES = 3
    RATE = 130

    def run
      queue = "drill-#{tag}-close"
      origin = "drill-#{tag}-close"
      charges, keys = db.charge_tables("drill_#{tag}_close")
      declare(AceMQ::AMQP::Topology.new.queue(queue))
      RUNNERS.times { |i| spawn_runner(runner_env(queue: queue, origin: "#{origin}-#{i}", charges: charges, keys: keys)) }
      @runners.each(&:await_running)

      all = orders("C", MESSAGES)
      result.messages = all.size
      t0 = Drill.now
      feed = publisher.pace(all, to: queue, rate: RATE, deadline: Drill.now + 60)
      recoveries = []
      closed = 0
      CLOSES.times do |k|
        at(t0, 1 + 1.5 * k, feed)
        closes = node.close_connections(origin)
        fail!("found no connection named #{origin}* to close") if closes.empty?
        closed += closes.size
        # Per runner: from the broker closing its consuming connection to
        # its next charge (a handler started after the close).
        backs = @runners.map do |r|
          t = closes.fetch("#{r.origin}:consume") { fail!("runner #{r.pid} had no consuming connection to close") }
          await_back(t, 15, "the broker closed #{r.origin}:consume", [r])
        end
        recoveries << backs.max
      end
      result.faults = CLOSES
      publisher.hurry
      join(feed, 60, "publishing")
      await_charged(charges, all, queue)
      settle(queue)
      account(charges, all, queue)
      result.recovery = "close to next charge #{seconds(recoveries)}"
      result.worst = recoveries.max
      result.notes = "#{closed} connections closed, #{reruns} re-run, #{publisher.retries} publish retries"
      stop_runners
    end
  end

  # c. The broker itself goes: stop_app/start_app, then kill -9 of the
  # node's VM and a fresh start on the same data directory. Durable queues
  # and persistent, confirmed messages survive both.
  class RestartBroker < Phase
    TITLE = "broker restart"
    # As for CloseConnections: long enough that the feed outlasts slow
    # recoveries on a loaded machine; unpaced once the faults are done.
    MESSAGES = 4800
    RUNNERS = 2
    RATE = 120

    def run
      queue = "drill-#{tag}-restart"
      origin = "drill-#{tag}-restart"
      charges, keys = db.charge_tables("drill_#{tag}_restart")
      declare(AceMQ::AMQP::Topology.new.queue(queue))
      RUNNERS.times { |i| spawn_runner(runner_env(queue: queue, origin: "#{origin}-#{i}", charges: charges, keys: keys)) }
      @runners.each(&:await_running)

      all = orders("R", MESSAGES)
      result.messages = all.size
      start = Drill.now
      feed = publisher.pace(all, to: queue, rate: RATE, deadline: Drill.now + 90)
      events = []
      # Down: from the broker's listener closing (stop_app) or the kill, to
      # the listener open again, both from the node's log. Back: from then to
      # each runner's next charge; the slowest runner is the figure.
      [["stop_app/start_app", 1.5, -> { node.stop_app }, -> { node.start_app }],
       ["kill -9 of the node", 6, -> { node.kill9 }, -> { node.start }]].each do |label, offset, down, up|
        at(start, offset, feed)
        called = Time.now.to_f
        down.call
        up.call
        # stop_app logs its listener stopping; a killed node logs nothing.
        gone = node.listener_stopped_after(called) || called
        open = Drill.eventually(10, "the node to log its listener for #{label}") { node.listener_started_after(gone) }
        back = @runners.map { |r| await_back(open, 30, label, [r]) }.max
        events << [label, open - gone, back]
      end
      result.faults = events.size
      publisher.hurry
      join(feed, 90, "publishing")
      await_charged(charges, all, queue)
      settle(queue)
      account(charges, all, queue)
      result.recovery = events.map { |label, out, back| format("%s: down %.1fs, back to next charge %.2fs", label, out, back) }
                              .join("; ")
      result.worst = events.map(&:last).max
      result.notes = "#{reruns} re-run, #{publisher.retries} publish retries"
      stop_runners
    end
  end

  # d. Outbox relays killed with SIGKILL mid-sweep while rows keep arriving.
  # A row is deleted only after its confirm, so a kill between the two
  # publishes it again (a duplicate on the wire) and never loses it; the
  # idempotent consumer charges each message id once.
  class KillRelays < Phase
    TITLE = "kill -9 outbox relays"
    ROWS = 2000
    BURST = 25 # rows per transaction, one every PACE seconds until the kills are done
    PACE = 0.3
    BATCH = 25
    KILLS = 6
    LEASE = 1

    Relay = Struct.new(:process, :worker)

    def run
      exchange = "drill-#{tag}-outbox"
      queue = "drill-#{tag}-outbox"
      audit = "drill-#{tag}-outbox-wire"
      @table = table = "drill_#{tag}_outbox"
      charges, keys = db.charge_tables("drill_#{tag}_outbox")
      declare(AceMQ::AMQP::Topology.new.exchange(exchange, type: :direct).queue(queue).queue(audit)
                .bind(queue, to: exchange, routing_key: "order.placed").bind(audit, to: exchange, routing_key: "order.placed"))
      writer = Drill.sql_connect(DATABASE_URL)
      @writer = writer
      store = AceMQ::AMQP::Patterns::SQLOutboxStore.new(connection: writer, table: table)
      store.create_schema
      db.track(table)
      spawn_runner(runner_env(queue: queue, origin: "drill-#{tag}-outbox-consumer", charges: charges, keys: keys))
      @runners.each(&:await_running)
      @relays = Array.new(2) { |i| start_relay(table, "relay-#{i}") }

      all = orders("O", ROWS)
      result.messages = all.size
      t0 = Drill.now
      inserting = Thread.new do
        Thread.current.report_on_exception = false
        all.each_slice(BURST) do |slice|
          db.transaction(writer) do
            slice.each do |o|
              store.add(AceMQ::AMQP::Patterns.record(publisher.mq, { "order_id" => o }, to: "order.placed", exchange: exchange,
                                                                                         type: "drill.order.v1"),
                        connection: writer)
            end
          end
          sleep PACE unless @killed
        end
      end
      mid = 0
      held = 0
      recoveries = []
      KILLS.times do |k|
        at(t0, 0.8 + k, inserting)
        # Mid-sweep: a relay holding a lease has claimed rows and not yet
        # deleted them (publishing, waiting for confirms, or just past them).
        victim = Drill.eventually(2, "a relay mid-sweep", interval: 0.001) { sweeping.sample(random: rng) } rescue nil
        mid += 1 if victim
        victim ||= @relays.sample(random: rng)
        killed_at = Drill.now
        kill_relay(victim)
        ids = leased_ids(victim.worker)
        held += ids.size
        @relays[@relays.index(victim)] = start_relay(table, "relay-#{2 + k}")
        # Recovery: until the rows the dead relay held have been published
        # by another relay and deleted (their lease ran out first).
        next if ids.empty?

        Drill.eventually(15, "the rows #{victim.worker} held to be relayed by another", interval: 0.02) do
          db.rows_left(@table, ids).zero?
        end
        recoveries << Drill.now - killed_at
      end
      result.faults = KILLS
      @killed = true
      join(inserting, 30, "inserting the outbox rows")
      Drill.eventually(60, "the outbox to empty (backlog #{store.backlog.inspect})", interval: 0.2) { store.backlog.count.zero? }
      await_charged(charges, all, queue)
      settle(queue)
      account(charges, all, queue)
      wire = wire_counts(audit)
      unsent = all - wire.keys
      fail!("#{unsent.size} rows deleted from the outbox but never published (#{unsent.first(5).join(', ')})") unless unsent.empty?
      result.wire_dups = wire.values.sum - wire.size
      result.recovery = "kill to its rows relayed #{seconds(recoveries)} (lease #{LEASE}s)"
      result.worst = recoveries.max
      result.notes = "#{mid} of #{KILLS} kills mid-sweep, #{held} rows in a dead relay's lease, " \
                     "#{result.wire_dups} sent twice; each charged once"
      @relays.each { |r| stop_relay(r) }
      stop_runners
    end

    # The live relays holding a lease right now.
    def sweeping
      workers = db.leasing_workers(@table)
      @relays.select { |r| workers.include?(r.worker) }
    end

    def leased_ids(worker) = db.leased_ids(@table, worker)

    def start_relay(table, worker)
      out = File.join(Dir.tmpdir, "acemq-drill-#{tag}-#{worker}.out")
      pid = Process.spawn(RbConfig.ruby, "-I", File.join(ROOT, "lib"), File.join(__dir__, "relay.rb"),
                          "--db", DATABASE_URL, "--amqp", node.url, "--table", table, "--worker", worker,
                          "--lease", LEASE.to_s, "--batch", BATCH.to_s, out: out, err: %i[child out])
      Children.add(pid)
      r = Relay.new(RunnerHelpers::RunnerProcess.new(pid: pid, log: out, output: out), worker)
      Drill.eventually(20, "relay #{worker} to start") do
        r.process.text.include?("relay running") || (r.process.wait(0) && fail!("relay #{worker} died:\n#{r.process.text}"))
      end
      r
    end

    def kill_relay(r)
      r.process.signal("KILL")
      r.process.wait(10) or fail!("relay #{r.process.pid} survived kill -9")
      Children.forget(r.process.pid)
    end

    def stop_relay(r)
      r.process.signal("TERM")
      status = r.process.wait(15)
      Children.forget(r.process.pid)
      fail!("relay #{r.worker} did not stop cleanly on TERM (#{status.inspect}):\n#{r.process.text}") unless status&.zero?
    end

    # { order_id => copies on the wire }, read off the audit queue with Bunny.
    def wire_counts(audit)
      bunny = Broker.new(node.url)
      bunny.take_all(audit).map { |_, body| JSON.parse(body).fetch("order_id") }.tally
    ensure
      bunny&.close
    end

    def teardown
      (@relays || []).each do |r|
        Process.kill("KILL", r.process.pid)
        r.process.wait(5)
      rescue Errno::ESRCH
        nil
      ensure
        Children.forget(r.process.pid)
      end
      Dir.glob(File.join(Dir.tmpdir, "acemq-drill-#{tag}-relay-*.out")).each { |f| File.delete(f) }
      @writer&.close
      super
    end
  end

  # e. A flood of deliveries the engine cannot read, published with Bunny
  # as another client would, between good ones. Each poison message goes to
  # {queue}.dlq with a reason and its body byte for byte; the good ones are
  # charged once; the runner stays live on the same two connections.
  class PoisonFlood < Phase
    TITLE = "poison flood"
    POISON = 2000
    GOOD = 500

    # [content_type or nil, body for message i]
    KINDS = [
      ["application/json", ->(i) { "\xFFnot json at all #{i}".b }],
      ["text/plain", ->(i) { "plain words #{i}" }],
      [nil, ->(i) { "<order id=\"#{i}\"/>" }],
      ["application/json", ->(i) { %({"order_id": "P-#{i}") }],
      ["application/xml", ->(i) { %({"order_id":"X-#{i}"}) }],
      ["application/octet-stream", ->(i) { [i].pack("N") + "\x00\x01\x02\xC3\x28".b }],
      ["application/json", ->(_) { "" }]
    ].freeze

    def run
      queue = "drill-#{tag}-poison"
      origin = "drill-#{tag}-poison"
      charges, keys = db.charge_tables("drill_#{tag}_poison")
      declare(AceMQ::AMQP::Topology.new.queue(queue))
      health_file = File.join(Dir.tmpdir, "acemq-drill-#{tag}-live")
      @health_file = health_file
      runner = spawn_runner(runner_env(queue: queue, origin: origin, charges: charges, keys: keys,
                                       extra: { "HEALTH_FILE" => health_file }))
      runner.await_running
      before = node.connections(origin).size

      good = orders("E", GOOD)
      sent = {}
      bunny = Broker.new(node.url)
      @bunny = bunny
      ch = bunny.session.create_channel
      ch.confirm_select
      samples = []
      flood = Thread.new do
        Thread.current.report_on_exception = false
        loop do
          samples << node.connections(origin).size
          sleep 0.3
        end
      end
      g = 0
      POISON.times do |i|
        type, body = KINDS[i % KINDS.size]
        id = "poison-#{i}"
        payload = body.call(i)
        sent[id] = payload
        ch.default_exchange.publish(payload, routing_key: queue, message_id: id, persistent: true,
                                             **(type ? { content_type: type } : {}))
        next unless (i % 4) == 3 && g < GOOD

        ch.default_exchange.publish(JSON.generate("order_id" => good[g]), routing_key: queue, message_id: "good-#{g}",
                                                                          persistent: true, content_type: "application/json")
        g += 1
      end
      while g < GOOD
        ch.default_exchange.publish(JSON.generate("order_id" => good[g]), routing_key: queue, message_id: "good-#{g}",
                                                                          persistent: true, content_type: "application/json")
        g += 1
      end
      fail!("the broker did not confirm every publish") unless ch.wait_for_confirms
      result.messages = POISON + GOOD
      result.faults = POISON

      await_charged(charges, good, queue)
      Drill.eventually(60, "#{POISON} dead letters in #{queue}.dlq", interval: 0.3) { depths(queue)["#{queue}.dlq"]&.first.to_i >= POISON }
      settle(queue)
      flood.kill
      flood.join(5)
      after = node.connections(origin).size

      # The runner: alive, live, the same connections, no restart.
      fail!("the runner died during the flood:\n#{runner.text}") if runner.exited?
      live = runner.health("/live")
      fail!("/live answered #{live.code} after the flood") unless live.code == "200"
      restarts = JSON.parse(runner.health("/status").body).fetch("consumers").sum { |c| c["restarts"] }
      fail!("the consumer restarted #{restarts} times during the flood") unless restarts.zero?
      fail!("no health file at #{health_file}") unless File.exist?(health_file)
      stale = Time.now - File.mtime(health_file)
      fail!("the health file is #{stale.round(1)}s old") if stale > 5
      if samples.max.to_i > before || after != before
        fail!("the runner's connections went from #{before} to #{after} (most seen: #{samples.max})")
      end

      # Every poison message in the DLQ, body byte for byte, with a reason.
      letters = bunny.take_all("#{queue}.dlq")
      by_id = letters.to_h { |props, body| [props[:message_id], [props, body]] }
      missing = sent.keys - by_id.keys
      altered = sent.reject { |id, body| !by_id.key?(id) || by_id[id][1].b == body.b }.keys
      reasonless = by_id.select { |_, (props, _)| props[:headers].to_h["x-acemq-reason"].to_s.empty? }.keys
      extra = letters.size - by_id.size
      result.lost = missing.size
      problems = []
      problems << "#{missing.size} poison messages not in the DLQ (#{missing.first(5).join(', ')})" unless missing.empty?
      problems << "#{altered.size} DLQ bodies changed (#{altered.first(5).join(', ')})" unless altered.empty?
      unless reasonless.empty?
        problems << "#{reasonless.size} dead letters without a reason (#{reasonless.first(3).join(', ')}; first: " \
                    "#{by_id[reasonless.first][0].inspect})"
      end
      problems << "#{extra} dead letters more than once" if extra.positive?
      # account reads the DLQ depth: it has just been taken off, so a
      # non-zero depth now is something dead-lettered twice or a good one.
      fail!(problems.join("; ")) unless problems.empty?

      account(charges, good, queue)
      runs = runner.handled.grep(/\Astart /).size
      fail!("the handler ran #{runs} times for #{GOOD} good messages") unless runs == GOOD
      reasons = letters.map { |props, _| props[:headers]["x-acemq-reason"].to_s.sub(/\d+/, "N")[0, 40] }.uniq.size
      result.recovery = "-"
      result.notes = "#{KINDS.size} kinds of poison, #{reasons} distinct reasons, connections #{before}→#{after} " \
                     "(most #{samples.max}), /live 200, 0 restarts"
      stop_runners
    end

    def teardown
      @bunny&.close
      File.delete(@health_file) if @health_file && File.exist?(@health_file)
      super
    end
  end
end
