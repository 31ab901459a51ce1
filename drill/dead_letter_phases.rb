# frozen_string_literal: true

require_relative "phase"

module Drill
  # i. The dead-letter store's ingester killed with kill -9 mid-ingest. A
  # stream of dead letters goes straight to {queue}.dlq while three runners
  # with c.dead_letter_store run: one ingests (the broker's exclusive
  # consume), the others stand by. The one ingesting is killed again and
  # again, and a new runner started each time; a standby takes over. What the
  # dead one had committed and not acknowledged comes back and is skipped by
  # the row's unique key; what it had not committed comes back and is
  # inserted. At the end every dead letter is in the store exactly once and
  # the DLQ is empty.
  class DeadLetterIngest < Phase
    TITLE = "kill -9 dead-letter ingesters"
    MESSAGES = 4000
    RUNNERS = 3
    KILLS = 4
    # Dead letters a second until the last kill, then the rest at once.
    RATE = 250
    # The runner the specs run too (runner_dead_letters_spec.rb).
    APP = File.expand_path("../spec/fixtures/runner_dead_letters_app.rb", __dir__)

    def run
      queue = "drill-#{tag}-dls"
      table = "drill_#{tag}_dls"
      db.track(table)
      db.track("#{table}_audit")
      @conn = Drill.sql_connect(DATABASE_URL)
      store = AceMQ::AMQP::SQLDeadLetterStore.new(connection: @conn, table: table, audit_table: "#{table}_audit")
      store.create_schema
      declare(AceMQ::AMQP::Topology.new.queue(queue))
      env = lambda do |i|
        { "AMQP_URL" => node.url, "QUEUE" => queue, "ORIGIN" => "drill-#{tag}-dls-#{i}", "DATABASE_URL" => DATABASE_URL,
          "DEAD_LETTER_TABLE" => table }
      end
      RUNNERS.times { |i| @runners << Runner.spawn(env.call(i), app: APP) }
      @runners.each(&:await_running)
      first = Drill.eventually(30, "one runner ingesting") { ingesting }

      all = orders("L", MESSAGES)
      result.messages = all.size
      t0 = Drill.now
      feed = publisher.pace(all, to: "#{queue}.dlq", rate: RATE, deadline: Drill.now + 60)
      takeovers = []
      held = []
      victim = first
      KILLS.times do |k|
        at(t0, 1.5 + (2 * k), feed)
        # Mid-ingest: it has taken deliveries since the last look, and holds
        # some unacknowledged (in a batch, or committed and not yet acked).
        before = received(victim)
        Drill.eventually(10, "runner #{victim.pid} to ingest") { received(victim).to_i > before.to_i }
        held << Drill.eventually(10, "#{queue}.dlq to have deliveries unacknowledged") do
          n = depths(queue)["#{queue}.dlq"]&.last
          n&.positive? && n
        end
        victim.kill9
        killed = Drill.now
        @runners << Runner.spawn(env.call(RUNNERS + k), app: APP)
        victim = Drill.eventually(30, "a standby to take #{queue}.dlq over after kill #{k + 1}") { ingesting }
        takeovers << Drill.now - killed
      end
      result.faults = KILLS
      publisher.hurry
      join(feed, 60, "publishing")
      Drill.eventually(60, "#{all.size} dead letters in the store", interval: 0.2) do
        store.counts(queue: queue)[:total] >= all.size && dlq_empty?(queue)
      end
      account(store, queue, all)
      result.recovery = "takeover #{seconds(takeovers)}"
      result.worst = takeovers.max
      result.notes = "unacknowledged at the kills #{held.join(', ')}; #{@runners.size} runners, " \
                     "#{publisher.retries} publish retries"
      stop_runners
    ensure
      @conn&.close
    end

    private

    # The runner whose /status says it has the DLQ, if one does.
    def ingesting
      @runners.reject(&:exited?).find { |r| state(r)&.fetch("state") == "ingesting" }
    end

    def received(runner) = state(runner)&.fetch("received")

    def state(runner)
      return nil unless runner.running? && runner.process.health_port

      JSON.parse(runner.health("/status").body)["dead_letters"]&.first
    rescue SystemCallError, Net::OpenTimeout, Net::ReadTimeout, JSON::ParserError
      nil
    end

    def dlq_empty?(queue) = depths(queue)["#{queue}.dlq"] == [0, 0]

    # Each order's dead letter in the store once, nothing else, the DLQ empty.
    def account(store, queue, all)
      stored = []
      cursor = nil
      loop do
        page = store.list(queue: queue, after_id: cursor, limit: 1000)
        stored.concat(page.letters.map { |l| JSON.parse(l.body)["order_id"] })
        break unless (cursor = page.next_cursor)
      end
      counts = stored.tally
      missing = all - counts.keys
      doubled = counts.select { |_, n| n > 1 }
      strangers = counts.keys - all
      result.lost = missing.size
      result.doubled = doubled.size
      dlq = depths(queue)["#{queue}.dlq"]
      problems = []
      problems << "#{missing.size} lost (#{missing.first(5).join(', ')})" unless missing.empty?
      problems << "#{doubled.size} stored twice or more (#{doubled.first(5).map { |o, n| "#{o}×#{n}" }.join(', ')})" unless doubled.empty?
      problems << "#{strangers.size} rows for letters never published" unless strangers.empty?
      problems << "the DLQ holds #{dlq.inspect} (ready, unacked)" unless dlq == [0, 0]
      fail!(problems.join("; ")) unless problems.empty?
    end
  end
end
