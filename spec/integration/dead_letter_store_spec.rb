# frozen_string_literal: true

require "spec_helper"
require "securerandom"
require "tmpdir"
require "sqlite3"
require "pg"
require "mysql2"
require "bunny"
require "uri"

# AceMQ::AMQP::SQLDeadLetterStore on RabbitMQ with SQLite (a file the
# library opens, and the application's own SQLite3::Database), PostgreSQL
# (a PG::Connection) and MariaDB (a Mysql2::Client): ingest, browse, filter,
# count, replay, discard, purge, prune and the audit, on real tables named
# per example and dropped after it.
RSpec.describe AceMQ::AMQP::SQLDeadLetterStore do
  Store = AceMQ::AMQP::SQLDeadLetterStore unless defined?(Store)

  def bunny
    @bunny ||= Bunny.new(AMQP_URL, logger: Logger.new(nil)).tap(&:start)
  end

  # A dead letter published straight to queue's DLQ, as another client's
  # ladder or a hostile publisher would.
  def dead_letter(queue, body, headers: {}, id: SecureRandom.uuid, type: "order.placed.v1")
    ch = bunny.create_channel
    ch.confirm_select
    ch.default_exchange.publish(body, routing_key: "#{queue}.dlq", message_id: id, type: type, headers: headers,
                                      content_type: "application/json", persistent: true)
    ch.wait_for_confirms
    ch.close
    id
  end

  def failure(reason, error_class)
    { "x-acemq-reason" => reason, "x-acemq-error-class" => error_class, "x-acemq-failed-at" => 1_700_000_000,
      "x-acemq-backtrace" => "app/handler.rb:12:in `call'\napp/worker.rb:3" }
  end

  def mysql
    u = URI(AceMQSpecHelpers::MYSQL_URL)
    Mysql2::Client.new(host: u.host, port: u.port || 3306, username: u.user, password: u.password,
                       database: u.path.delete_prefix("/"), encoding: "utf8mb4")
  end

  let(:table) { "dl_#{SecureRandom.hex(5)}" }
  let(:dir) { Dir.mktmpdir("acemq-dead-letters") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:queue) { unique("dls") }

  before { mq.apply(AceMQ::AMQP::Topology.new.queue(queue)) }

  after do
    mq.teardown(AceMQ::AMQP::Topology.new.queue(queue), force: true)
    mq.close
    @bunny&.close
  end

  {
    "SQLite (path:)" => :path,
    "SQLite (connection:)" => :sqlite,
    "PostgreSQL" => :pg,
    "MariaDB" => :mysql
  }.each do |name, kind|
    context "on #{name}" do
      let(:db) do
        case kind
        when :sqlite then SQLite3::Database.new(File.join(dir, "app.db")).tap { _1.busy_timeout = 10_000 }
        when :pg then PG.connect(AceMQSpecHelpers::DATABASE_URL).tap { |c| c.set_notice_processor { |_| } }
        when :mysql then mysql
        end
      end
      let(:store) do
        options = { table: table, audit_table: "#{table}_audit" }
        s = kind == :path ? Store.new(path: File.join(dir, "dead.db"), **options) : Store.new(connection: db, **options)
        s.tap(&:create_schema)
      end

      after do
        case kind
        when :pg then [table, "#{table}_audit"].each { db.exec("DROP TABLE IF EXISTS #{_1}") }
        when :mysql then [table, "#{table}_audit"].each { db.query("DROP TABLE IF EXISTS #{_1}") }
        end
        db&.close
        FileUtils.rm_rf(dir)
      end

      it "ingests a DLQ once, and browses, filters, pages and counts it" do
        ids = 6.times.map do |n|
          reason, klass = n.even? ? ["card 100% declined", "Payments::Declined"] : ["timed out", "Net::ReadTimeout"]
          dead_letter(queue, %({"n":#{n}}), headers: failure(reason, klass))
        end
        expect(store.ingest_once(mq, queue)).to eq(6)
        expect(mq.queue_counts("#{queue}.dlq")[:ready]).to eq(0)
        expect(store.ingest_once(mq, queue)).to eq(0)

        first = store.list(queue: queue, limit: 4)
        expect(first.letters.size).to eq(4)
        rest = store.list(queue: queue, after_id: first.next_cursor, limit: 4)
        expect(rest.next_cursor).to be_nil
        all = first.letters + rest.letters
        expect(all.map(&:id)).to eq(all.map(&:id).sort.reverse)
        expect(all.map(&:message_id)).to match_array(ids)

        letter = store.find(all.first.id)
        expect(letter).to have_attributes(queue: queue, type: "order.placed.v1", failed_at: 1_700_000_000,
                                          backtrace: "app/handler.rb:12:in `call'\napp/worker.rb:3", attempt: 1)
        expect(letter.body).to eq(%({"n":5}).b)
        expect(letter.properties["content_type"]).to eq("application/json")
        expect(store.find(-1)).to be_nil

        expect(store.list(reason: "100% DECLINED").letters.size).to eq(3)
        expect(store.list(error_class: "Net::ReadTimeout", queue: queue).letters.map(&:reason).uniq).to eq(["timed out"])
        expect(store.list(id: ids[2]).letters.map(&:message_id)).to eq([ids[2]])
        expect(store.list(since: Time.at(1_700_000_000), before: Time.at(1_700_000_001)).letters.size).to eq(6)
        expect(store.list(before: Time.at(1_700_000_000)).letters).to be_empty

        counts = store.counts(queue: queue)
        expect(counts).to eq(total: 6, by_queue: { queue => 6 },
                             by_reason: { "card 100% declined" => 3, "timed out" => 3 },
                             by_error_class: { "Net::ReadTimeout" => 3, "Payments::Declined" => 3 })
      end

      it "replays letters whose handler still fails each exactly once, and the copies come back as new rows" do
        seen = Hash.new(0)
        lock = Mutex.new
        sub = mq.consume(queue, retries: { max_attempts: 1 }) do |m|
          lock.synchronize { seen[m.id] += 1 }
          raise "still failing"
        end
        ingester = store.ingest(mq, queue, retry_every: 0.2)
        10.times { |n| mq.publish({ n: n }, to: queue) }
        eventually(timeout: 20) { store.counts(queue: queue)[:total] == 10 }

        report = store.replay(mq, queue: queue, actor: "ops@example.com", rate: 100)
        expect(report).to include(selected: 10, replayed: 10, skipped: 0)
        eventually(timeout: 20) { lock.synchronize { seen.values.sum } == 20 && store.counts(queue: queue)[:total] == 10 }
        expect(seen.size).to eq(10)
        expect(seen.values).to all(eq(2))
        again = store.list(queue: queue).letters
        expect(again.map { _1.headers["x-acemq-replayed-by"] }.uniq).to eq([report[:id]])
        expect(again.map { _1.history.size }.uniq).to eq([1])
        expect(again.first.error_class).to eq("RuntimeError")

        audit = store.audit(limit: 5).first
        expect(audit).to include(actor: "ops@example.com", action: "replay", queue: queue, count: 10)
        expect(audit[:detail]).to include("replay" => report[:id], "selected" => 10)
      ensure
        ingester&.stop
        sub&.cancel
      end

      it "leaves the rows a running replay is sending to it: a purge or discard meanwhile skips them, and counts are true" do
        10.times { |n| dead_letter(queue, %({"n":#{n}}), headers: failure("slow #{n}", "E")) }
        store.ingest_once(mq, queue)
        ids = store.list(queue: queue).letters.map(&:id)
        # At 2 a second the replay leases its first chunk (10) at once and
        # sends for about 5 s.
        replay = Thread.new { store.replay(mq, queue: queue, actor: "alice", rate: 2) }
        eventually(timeout: 10) { mq.queue_counts(queue)[:ready].positive? }
        # The break-it run: these deleted leased rows, the replay sent them
        # anyway and counted 0, and the purge counted them purged.
        expect(store.discard(ids.first(3), actor: "bob")).to eq(0)
        expect(store.purge(queue: queue, actor: "bob")).to eq(0)
        report = replay.value
        expect(report).to include(replayed: 10, skipped: 0)
        eventually(timeout: 10) { mq.queue_counts(queue)[:ready] == 10 }
        expect(store.counts(queue: queue)[:total]).to eq(0)
        expect(store.audit(limit: 3).map { _1.values_at(:action, :count) }).to eq([["replay", 10], ["purge", 0], ["discard", 0]])
      end

      it "keeps one ingester per DLQ: a second stands by and takes over when the first stops" do
        logged = []
        logger = Object.new.tap { |l| l.define_singleton_method(:warn) { |m| logged << m } }
        first = store.ingest(mq, queue, retry_every: 0.2)
        eventually { first.active? }
        second = store.ingest(mq, queue, retry_every: 0.2, logger: logger)
        eventually { second.standby? }
        expect(second).not_to be_active
        expect(second.last_error).to be_a(AceMQ::AMQP::AccessRefused)
        expect(logged.grep(/standing by/).size).to eq(1)
        expect { store.ingest_once(mq, queue) }.to raise_error(AceMQ::AMQP::AccessRefused)
        dead_letter(queue, "{}", headers: failure("one", "E"))
        eventually(timeout: 10) { store.counts[:total] == 1 }
        expect(first.stop).to be(true)
        eventually(timeout: 10) { second.active? }
        dead_letter(queue, "{}", headers: failure("two", "E"))
        eventually(timeout: 10) { store.counts[:total] == 2 }
        # received counts a batch once it is committed and acknowledged, a
        # moment after its row is visible (CI read 0 here once).
        eventually(timeout: 10) { second.received == 1 }
        expect(first.received).to eq(1)
      ensure
        first&.stop
        second&.stop
      end

      it "loses and doubles nothing when an ingester is killed with kill -9 under a stream of dead letters" do
        skip "one SQLite and one server database are enough for a process test" unless %i[path pg].include?(kind)

        store # the tables, before the child opens them
        options = { table: table, audit_table: "#{table}_audit" }
        child = fork do
          own = AceMQ::AMQP::Connection.open(AMQP_URL)
          s = kind == :path ? Store.new(path: File.join(dir, "dead.db"), **options) : Store.new(connection: PG.connect(AceMQSpecHelpers::DATABASE_URL), **options)
          s.ingest(own, queue, batch: 7, retry_every: 0.2)
          sleep
        end
        total = 1000
        ids = total.times.map { "kill-#{_1}" }
        ch = bunny.create_channel
        ch.confirm_select
        # The stream goes on while the ingester is killed.
        publisher = Thread.new do
          ids.each_with_index do |id, n|
            ch.default_exchange.publish(%({"n":#{n}}), routing_key: "#{queue}.dlq", message_id: id,
                                                      headers: failure("r", "E"), persistent: true)
            ch.wait_for_confirms if (n % 50) == 49
          end
          ch.wait_for_confirms
        end
        eventually(timeout: 20) { store.counts[:total] >= 60 }
        Process.kill(:KILL, child)
        Process.wait(child)
        child = nil
        expect(store.counts[:total]).to be < total
        publisher.join
        # The broker lets go of the exclusive consumer when the dead process's
        # connection closes: until then the DLQ is refused.
        eventually(timeout: 20) do
          store.ingest_once(mq, queue)
          store.counts[:total] == total
        rescue AceMQ::AMQP::AccessRefused
          false
        end
        stored = []
        cursor = nil
        loop do
          page = store.list(queue: queue, after_id: cursor, limit: 1000)
          stored.concat(page.letters.map(&:message_id))
          break unless (cursor = page.next_cursor)
        end
        expect(stored.size).to eq(total)
        expect(stored).to match_array(ids)
        expect(mq.queue_counts("#{queue}.dlq")[:ready]).to eq(0)
      ensure
        if child
          Process.kill(:KILL, child)
          Process.wait(child)
        end
        publisher&.join
        ch&.close
      end

      it "stores a hostile publisher's headers and bytes losslessly, and never errors" do
        markup = %(<img src=x onerror=alert(2)>"'&)
        shapes = [[5], "a string", { "a" => { "b" => [1, "<b>"] } }, [{ "attempts" => markup, "failed_at" => "yesterday" }]]
        sent = shapes.each_with_index.map do |history, i|
          headers = failure(markup, markup).merge("x-acemq-history" => history, "x-#{markup}" => markup,
                                                  "x-acemq-failed-at" => markup)
          body = i.zero? ? "\xFF\xFE\x00<\x80".b : "<script>#{i}</script>"
          [dead_letter(queue, body, headers: headers, id: "#{markup}#{i}", type: markup), body.b, headers]
        end
        expect(store.ingest_once(mq, queue)).to eq(4)
        letters = store.list(queue: queue).letters
        sent.each do |id, body, headers|
          l = letters.find { _1.message_id == id }
          expect(l.body).to eq(body)
          expect(l.body.encoding).to eq(Encoding::BINARY)
          headers.each { |k, v| expect(l.headers[k]).to eq(v) }
          expect(l.history).to eq(headers["x-acemq-history"])
          expect(l).to have_attributes(reason: markup, error_class: markup, type: markup)
        end
        expect(letters.find { _1.body.start_with?("\xFF".b) }.body_text).to eq("\uFFFD\uFFFD\u0000<\uFFFD")
        expect(store.counts(queue: queue, reason: "ONERROR")[:by_reason]).to eq(markup => 4)
      end

      it "discards, purges and prunes, each in the audit, and says what to do with bad input" do
        4.times { |n| dead_letter(queue, "{}", headers: failure("r#{n % 2}", "E")) }
        store.ingest_once(mq, queue)
        ids = store.list(queue: queue, reason: "r0").letters.map(&:id)
        expect(store.discard([ids.first], actor: "alice")).to eq(1)
        expect(store.purge(queue: queue, reason: "r1", actor: "bob")).to eq(2)
        expect(store.prune(max_count: 0, queue: queue)).to eq(1)
        expect(store.prune(max_age: 60)).to eq(0)
        expect(store.counts[:total]).to eq(0)
        expect(store.audit.map { _1.values_at(:action, :actor, :count) })
          .to eq([["prune", "acemq retention", 1], ["purge", "bob", 2], ["discard", "alice", 1]])

        bad = AceMQ::AMQP::ConfigurationError
        expect { store.purge(actor: "bob") }.to raise_error(bad, /all: true/)
        expect { store.list(status: "x") }.to raise_error(bad, /unknown dead-letter filter :status.*queue: reason:/)
        expect { store.list(limit: 0) }.to raise_error(bad, /1 to 1000/)
        expect { store.discard([1], actor: "") }.to raise_error(bad, /actor/)
        expect { store.replay(mq, ids: [1], actor: "x", rate: 0) }.to raise_error(bad, /rate must be a positive/)
        # A rate near zero panicked core (a wait no Duration holds) and
        # killed the process; now refused like 0.
        [1e-300, 1e-320, 1e7].each do |r|
          expect { store.replay(mq, ids: [1], actor: "x", rate: r) }.to raise_error(bad, /from 0.001 to/)
        end
        [Float::NAN, Float::INFINITY, -1].each { |r| expect { store.replay(mq, ids: [1], actor: "x", rate: r) }.to raise_error(bad, /rate/) }
        expect { store.replay(mq, ids: [1], actor: "x", route: :fanout) }.to raise_error(bad, /route:/)
        expect { Store.new(path: File.join(dir, "x.db"), connection: Object.new) }.to raise_error(bad, /exactly one/)
        expect { Store.new(path: File.join(dir, "t.db"), table: "x; DROP") }.to raise_error(bad, /plain identifier/)
        expect(store.schema_sql("mysql").first).to include("CREATE TABLE IF NOT EXISTS #{table}")

        # The break-it run: a blank reason (a form's empty field) purged
        # every queue's rows, and so did since: "garbage" and all: "no".
        2.times { dead_letter(queue, "{}", headers: failure("r9", "E")) }
        store.ingest_once(mq, queue)
        [{ reason: "" }, { reason: "  " }, { queue: "" }, { all: "no" }].each do |f|
          expect { store.purge(actor: "bob", **f) }.to raise_error(bad, /all: true/)
        end
        expect { store.purge(actor: "bob", since: "garbage") }.to raise_error(bad, /since: takes a Time/)
        # Ruby's RangeError and NoMethodError, before.
        [2**70, -2**70, 1e30].each { |t| expect { store.list(since: t) }.to raise_error(bad, /since: .* out of range/) }
        expect { store.replay(mq, actor: "bob", queue: queue, route: 5) }.to raise_error(bad, /route:/)
        # A replay with no filter, or blank ones, replayed every queue's.
        [{}, { reason: "" }, { queue: " " }].each do |f|
          expect { store.replay(mq, actor: "bob", **f) }.to raise_error(bad, /replay every dead letter of every queue/)
        end
        expect(mq.queue_counts(queue)[:ready]).to eq(0)
        expect(store.counts[:total]).to eq(2)
        # all: true beside a filter is that filter, not everything.
        dead_letter(queue, "{}", headers: failure("kept", "E"))
        store.ingest_once(mq, queue)
        expect(store.purge(actor: "bob", all: true, reason: "r9")).to eq(2)
        expect(store.list.letters.map(&:reason)).to eq(["kept"])
        expect(store.purge(actor: "bob", all: true)).to eq(1)
        expect(store.counts[:total]).to eq(0)
        2.times { dead_letter(queue, "{}", headers: failure("r9", "E")) }
        store.ingest_once(mq, queue)
        # Numbers that are not numbers: a ConfigurationError naming them,
        # not Ruby's RangeError, TypeError or ArgumentError.
        [-1, nil, "abc", 2**70, 1.5].each { |v| expect { store.list(limit: v) }.to raise_error(bad, /limit: must be a whole number/) }
        expect { store.find("abc") }.to raise_error(bad, /id: must be/)
        expect { store.discard([2**70], actor: "a") }.to raise_error(bad, /ids: must be/)
        expect { store.counts(top: nil) }.to raise_error(bad, /top: must be/)
        expect { store.prune(max_count: -1) }.to raise_error(bad, /max_count: must be/)
        expect { store.replay(mq, ids: ["x"], actor: "a") }.to raise_error(bad, /ids: must be/)
        expect { store.list(reason: "\xFF".b.force_encoding(Encoding::UTF_8)) }.to raise_error(bad, /reason: must be UTF-8/)
        expect { store.ingest(mq, queue, retry_every: 0) }.to raise_error(bad, /retry_every: must be/)
        expect(store.counts[:total]).to eq(2)
      end
    end
  end

  # A reason filter is a substring: on PostgreSQL a trigram index answers it
  # (3 in 100,000 rows: under 1 ms, from 80-100 ms by a scan;
  # bench/dead_letters.rb). Where the role may not create the extension, the
  # schema is made all the same and the filter scans.
  context "on PostgreSQL, the reason's trigram index" do
    let(:admin) { PG.connect(AceMQSpecHelpers::DATABASE_URL).tap { |c| c.set_notice_processor { |_| } } }

    after { admin.close }

    it "is made by create_schema and answers a reason filter" do
      store = Store.new(connection: admin, table: table, audit_table: "#{table}_audit")
      2.times { store.create_schema } # IF NOT EXISTS, the block too
      expect(admin.exec_params("SELECT indexdef FROM pg_indexes WHERE indexname = $1", ["#{table}_reason"]).values.flatten)
        .to eq(["CREATE INDEX #{table}_reason ON public.#{table} USING gin (reason gin_trgm_ops)"])
      plan = admin.transaction do |c|
        c.exec("SET LOCAL enable_seqscan = off")
        c.exec_params("EXPLAIN SELECT id FROM #{table} WHERE reason ILIKE $1 ESCAPE '!'", ["%declined%"]).values.flatten.join("\n")
      end
      expect(plan).to include("Bitmap Index Scan on #{table}_reason")
    ensure
      [table, "#{table}_audit"].each { admin.exec("DROP TABLE IF EXISTS #{_1}") }
    end

    it "is left out where the role may not create the extension, and the filter still answers" do
      db = "acemq_spec_notrgm_#{SecureRandom.hex(3)}"
      role = "acemq_spec_low_#{SecureRandom.hex(3)}"
      admin.exec("CREATE ROLE #{role} LOGIN")
      admin.exec("CREATE DATABASE #{db}")
      PG.connect(AceMQSpecHelpers::DATABASE_URL.sub(%r{/[^/]*\z}, "/#{db}")).tap do |c|
        c.exec("REVOKE CREATE ON DATABASE #{db} FROM PUBLIC")
        c.exec("CREATE SCHEMA app AUTHORIZATION #{role}")
      end.close
      url = AceMQSpecHelpers::DATABASE_URL.sub(%r{/[^/]*\z}, "/#{db}").sub(%r{//[^@/]*@}, "//#{role}@")
      low = PG.connect(url)
      notices = []
      low.set_notice_processor { notices << _1 }
      low.exec("SET search_path = app")
      store = Store.new(connection: low)
      store.create_schema
      expect(notices.join).to include("no trigram index on acemq_dead_letters.reason")
      expect(low.exec("SELECT indexname FROM pg_indexes WHERE indexname LIKE '%_reason'").ntuples).to eq(0)
      low.exec("INSERT INTO acemq_dead_letters (queue, message_id, content_hash, body, body_encoding, headers, properties, " \
               "reason, attempt, failed_at, ingested_at) VALUES ('q', 'm1', 'h', '', 'utf8', '{}', '{}', 'Card DECLINED', 1, 0, 0)")
      expect(store.list(reason: "declined").letters.map(&:message_id)).to eq(["m1"])
      low.close
    ensure
      admin.exec("DROP DATABASE IF EXISTS #{db}")
      admin.exec("DROP ROLE IF EXISTS #{role}")
    end
  end
end
