# frozen_string_literal: true

require_relative "phase"
require_relative "postgres"

module Drill
  # f. The database goes instead of the broker. Three runners charge through
  # the ActiveRecord store and a relay sweeps a SQLOutboxStore, all on a
  # private PostgreSQL, while backends are terminated with
  # pg_terminate_backend mid-claim and mid-confirm (a runner's transaction
  # open, a relay's statement running) and the server is stopped
  # (immediate: no checkpoint, every client cut) and started again. What a
  # failing store or a handler that found the database away does is wait
  # round the ladder without spending attempts, so nothing is dead-lettered;
  # the charge and the confirm commit together, so nothing is charged twice.
  class DatabaseOutage < Phase
    TITLE = "PostgreSQL restart, kills"
    MESSAGES = 1200  # published straight to the queue
    ROWS = 400       # and these through the outbox and the relay
    BURST = 10       # outbox rows a transaction
    RUNNERS = 3
    RATE = 100
    # Rounds of pg_terminate_backend before and after the restart.
    KILLS_BEFORE = 3
    KILLS_AFTER = 3
    RESTART_AT = 4.5

    # The phase's own server: the accounting reads it, not the shared one.
    def db = @pdb || super

    def run
      @pg = PrivatePostgres.new(dir: File.join(Dir.tmpdir, "acemq-drill-#{tag}-pg")).create
      @pdb = Database.new(@pg.url("drill-accounting"))
      queue = "drill-#{tag}-db"
      exchange = "drill-#{tag}-db"
      table = "drill_#{tag}_db_outbox"
      charges, keys = @pdb.charge_tables("drill_#{tag}_db")
      declare(AceMQ::AMQP::Topology.new.exchange(exchange, type: :direct).queue(queue)
                .bind(queue, to: exchange, routing_key: "order.placed"))
      @writer = PG.connect(@pg.url("drill-writer")).tap { |c| c.set_notice_processor { |_| } }
      outbox = AceMQ::AMQP::Patterns::SQLOutboxStore.new(connection: @writer, table: table)
      outbox.create_schema
      RUNNERS.times do |i|
        spawn_runner(runner_env(queue: queue, origin: "drill-#{tag}-db-#{i}", charges: charges, keys: keys,
                                extra: { "DATABASE_URL" => @pg.url("drill-runner") }))
      end
      @runners.each(&:await_running)
      @relay = start_relay(table)

      direct = orders("D", MESSAGES)
      through = orders("B", ROWS)
      all = direct + through
      result.messages = all.size
      t0 = Drill.now
      feed = publisher.pace(direct, to: queue, rate: RATE, deadline: Drill.now + 90)
      writing = write_outbox(outbox, exchange, through)

      kills = []
      rounds = []
      KILLS_BEFORE.times { |k| at(t0, 1 + k, feed); rounds << kill_round(kills) }
      at(t0, RESTART_AT, feed)
      stopped = Time.now.to_f
      @pg.stop("immediate")
      sleep 1 # away for a second: long enough that every client notices
      @pg.start
      up = Time.now.to_f
      @pdb.conn.reset
      KILLS_AFTER.times { |k| at(t0, RESTART_AT + 2 + k, feed); rounds << kill_round(kills) }
      back = @runners.map { |r| await_back(up, 60, "the private PostgreSQL started again", [r]) }.max
      kill_backs = rounds.compact.map { |t| back_at_work(t) }.compact

      result.faults = 1 + kills.size
      publisher.hurry
      join(feed, 90, "publishing")
      join(writing, 60, "writing the outbox rows (#{@writer_retries} retries, last: #{@writer_error})")
      Drill.eventually(60, "the outbox to empty", interval: 0.2) { Integer(@pdb.value("SELECT COUNT(*) FROM #{table}")).zero? }
      await_charged(charges, all, queue)
      settle(queue)
      account(charges, all, queue)
      relayed = first_outbox_charge_after(charges, up)
      mid = kills.count { |_, state| state != "idle" }
      result.recovery = format("restart: down %.1fs, back to next charge %.2fs, outbox order %s; kill to next charge %s",
                               up - stopped, back, relayed ? format("%.2fs", relayed) : "-", seconds(kill_backs))
      result.worst = back
      result.notes = "#{kills.size} backends terminated (#{mid} in a transaction or statement: " \
                     "#{kills.map(&:first).tally.map { |a, n| "#{a} #{n}" }.join(', ')}), #{reruns} re-run, " \
                     "#{@writer_retries} outbox writes retried"
      stop_relay
      stop_runners
    end

    private

    # One round: wait (at most a second) for a runner or the relay to be in
    # a transaction or running a statement on the drill's tables, then
    # terminate those backends; if none was caught, one idle backend
    # instead, so every round cuts somebody. Returns the wall time.
    def kill_round(kills)
      caught = nil
      deadline = Drill.now + 1
      until caught || Drill.now > deadline
        rows = backends.reject { |_, _, state, _| state == "idle" }
        caught = rows unless rows.empty?
        sleep 0.002 unless caught
      end
      caught ||= backends.sample(1, random: rng)
      t = Time.now.to_f
      caught.each do |pid, app, state, _|
        kills << [app, state] if @pdb.value("SELECT pg_terminate_backend($1)", [pid]) == "t"
      end
      t
    end

    # [pid, application_name, state, query] of the runners' and the relay's
    # backends.
    def backends
      @pdb.exec("SELECT pid, application_name, state, query FROM pg_stat_activity WHERE pid <> pg_backend_pid() " \
                "AND application_name IN ('drill-runner', 'drill-relay')").values
    end

    # The outbox rows, BURST a transaction, as the application would write
    # them: each record built once, so a transaction retried after the
    # database went away writes the same message ids (a commit that happened
    # but whose answer was lost becomes a duplicate the consumer absorbs).
    def write_outbox(outbox, exchange, through)
      @writer_retries = 0
      Thread.new do
        Thread.current.report_on_exception = false
        through.each_slice(BURST) do |slice|
          records = slice.map do |o|
            AceMQ::AMQP::Patterns.record(publisher.mq, { "order_id" => o }, to: "order.placed", exchange: exchange,
                                                                             type: "drill.order.v1")
          end
          begin
            # A new connection for one that broke (ruby-pg's reset finishes
            # a connection it fails to reset while the server is away).
            if @writer.finished? || @writer.status != PG::CONNECTION_OK
              @writer.close unless @writer.finished?
              @writer = PG.connect(@pg.url("drill-writer")).tap { |c| c.set_notice_processor { |_| } }
            end
            @writer.transaction { records.each { |r| outbox.add(r, connection: @writer) } }
          rescue PG::Error, AceMQ::AMQP::Error => e
            @writer_error = "#{e.class}: #{e.message.strip[0, 200]}"
            @writer_retries += 1
            sleep 0.1
            retry
          end
          sleep 0.12
        end
      end
    end

    # Seconds from t (wall) to the first charge of an order that came
    # through the outbox, by a handler that started after t.
    def first_outbox_charge_after(_charges, t)
      first = runs.select { |s, _, o, _| s > t && o.start_with?("B-") }.map { |_, c, _, _| c }.min
      first && first - t
    end

    def start_relay(table)
      out = File.join(Dir.tmpdir, "acemq-drill-#{tag}-db-relay.out")
      pid = Process.spawn(RbConfig.ruby, "-I", File.join(ROOT, "lib"), File.join(__dir__, "relay.rb"),
                          "--db", @pg.url("drill-relay"), "--amqp", node.url, "--table", table, "--worker", "db-relay",
                          "--lease", "2", "--batch", "10", out: out, err: %i[child out])
      Children.add(pid)
      r = RunnerHelpers::RunnerProcess.new(pid: pid, log: out, output: out)
      Drill.eventually(20, "the relay to start") do
        r.text.include?("relay running") || (r.wait(0) && fail!("the relay died:\n#{r.text}"))
      end
      r
    end

    def stop_relay
      @relay.signal("TERM")
      status = @relay.wait(15)
      Children.forget(@relay.pid)
      fail!("the relay did not stop cleanly on TERM (#{status.inspect}):\n#{@relay.text.lines.last(10).join}") unless status&.zero?
    end

    def teardown
      if @relay
        begin
          Process.kill("KILL", @relay.pid)
          @relay.wait(5)
        rescue Errno::ESRCH
          nil
        end
        Children.forget(@relay.pid)
        File.delete(@relay.log) if File.exist?(@relay.log.to_s)
      end
      super
    ensure
      # The server goes whatever failed above: a leaked one outlives the drill.
      begin
        @writer.close if @writer && !@writer.finished?
        @pdb&.drop_all
      rescue PG::Error
        nil
      end
      @pg&.destroy
    end
  end
end
