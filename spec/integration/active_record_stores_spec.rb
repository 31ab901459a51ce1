# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"

# AceMQ::Rails::ActiveRecordIdempotencyStore on the guide's table and
# migration, through ActiveRecord 6.1, on SQLite and PostgreSQL; beside it
# the guide's own store, verbatim (spec/support/seed/), to show the one thing
# the shipped store adds: confirmed?, and with it a consumer killed
# mid-handler whose message is retried instead of lost.
module ActiveRecordStoresSpec
  Patterns = AceMQ::AMQP::Patterns
  Ack = AceMQ::AMQP::Ack

  def self.message(id, payload = { "order_id" => "A-1" })
    AceMQ::AMQP::Message.new(payload: payload, envelope: AceMQ::AMQP::Envelope.new(id: id))
  end

  def self.postgres_skip = ActiveRecordSpecHelpers.postgres? ? false : "DATABASE_URL is not set"

  RSpec.shared_examples "the shipped ActiveRecord idempotency store" do
    let(:store) { AceMQ::Rails::ActiveRecordIdempotencyStore.new(worker: "w-1") }
    let(:other) { AceMQ::Rails::ActiveRecordIdempotencyStore.new(worker: "w-2") }

    def row(key) = HandledMessage.find_by(message_id: key)

    it "claims a key once: the INSERT is the claim, and the row says who holds it" do
      expect(store.first_time?("k-1")).to be(true)
      expect(other.first_time?("k-1")).to be(false)
      expect(store.first_time?("k-1")).to be(false)
      expect(row("k-1")).to have_attributes(state: "CLAIMED", claimed_by: "w-1")
      expect(row("k-1").expires_at - row("k-1").recorded_at).to be_within(1).of(24 * 3600)
    end

    it "takes over a stale CLAIMED row, and never a CONFIRMED one however old" do
      store.first_time?("stale")
      store.first_time?("done")
      store.confirm("done")
      expect(other.first_time?("stale")).to be(false) # live: honoured

      age_claim("stale", by: 301)
      age_claim("done", by: 3600)
      expect(other.first_time?("stale")).to be(true)
      expect(row("stale").claimed_by).to eq("w-2")
      expect(store.first_time?("stale")).to be(false) # the takeover moved recorded_at to now
      expect(other.first_time?("done")).to be(false)
      expect(row("done")).to have_attributes(state: "CONFIRMED", claimed_by: "w-1")
    end

    it "honours claim_timeout: as given" do
      short = AceMQ::Rails::ActiveRecordIdempotencyStore.new(worker: "w-3", claim_timeout: 10)
      store.first_time?("k")
      age_claim("k", by: 5)
      expect(short.first_time?("k")).to be(false)
      age_claim("k", by: 6)
      expect(short.first_time?("k")).to be(true)
    end

    it "confirms idempotently, and confirmed? tells a handled key from a claimed one" do
      expect(store.confirmed?("k")).to be(false)
      store.first_time?("k")
      expect(store.confirmed?("k")).to be(false)
      expect(store.confirm("k")).to be_nil
      expect(store.confirm("k")).to be_nil
      expect(store.confirmed?("k")).to be(true)
      expect(other.confirmed?("k")).to be(true)
      expect(row("k").state).to eq("CONFIRMED")
    end

    it "forgets only its own live claim, never another worker's and never a confirmed key" do
      store.first_time?("mine")
      store.first_time?("done")
      store.confirm("done")
      other.forget("mine")
      expect(row("mine")).not_to be_nil
      store.forget("done")
      expect(row("done").state).to eq("CONFIRMED")

      expect(store.forget("mine")).to be_nil
      expect(row("mine")).to be_nil
      expect(other.first_time?("mine")).to be(true) # the retry really runs
    end

    it "purges keys past their retention, and nothing else" do
      %w[old-claimed old-confirmed fresh].each { |k| store.first_time?(k) }
      store.confirm("old-confirmed")
      HandledMessage.where(message_id: %w[old-claimed old-confirmed]).update_all(expires_at: Time.now.utc - 1)

      expect(store.purge_expired).to eq(2)
      expect(HandledMessage.pluck(:message_id)).to eq(["fresh"])
      expect(store.purge_expired).to eq(0)
    end

    it "remembers a key for retention: seconds" do
      brief = AceMQ::Rails::ActiveRecordIdempotencyStore.new(retention: 60)
      brief.first_time?("k")
      expect(row("k").expires_at - row("k").recorded_at).to be_within(0.01).of(60)
    end

    it "binds a binary key as UTF-8 text: one key whatever the encoding, and found from a console" do
      binary = "ordre-\xC3\xA9".b
      expect(store.first_time?(binary)).to be(true)
      expect(other.first_time?("ordre-é")).to be(false)
      store.confirm("ordre-é")
      expect(store.confirmed?(binary)).to be(true)
      expect(HandledMessage.where(message_id: "ordre-é").count).to eq(1)
      mysql = respond_to?(:mysql?) && mysql?
      type_sql = if mysql then "CHARSET(message_id)" # text in utf8mb4, not bytes
                 elsif sqlite? then "typeof(message_id)"
                 else "pg_typeof(message_id)::text"
                 end
      typeof = HandledMessage.connection.select_value(
        HandledMessage.sanitize_sql_array(["SELECT #{type_sql} FROM acemq_idempotency WHERE message_id = ?", "ordre-é"])
      )
      expect(typeof).to eq(mysql ? "utf8mb4" : sqlite? ? "text" : "character varying")
    end

    it "refuses what the column cannot hold, bytes that are not UTF-8, and nil — on SQLite as on PostgreSQL" do
      expect { store.first_time?("x" * 256) }.to raise_error(ArgumentError, /256 characters.*holds 255/)
      expect(store.first_time?("x" * 255)).to be(true)
      expect { store.first_time?("\xFF".b) }.to raise_error(AceMQ::AMQP::EncodingError, /not UTF-8.*hex-encode/)
      expect { store.first_time?(nil) }.to raise_error(ArgumentError, /required/)
    end

    it "shares the guide's table with the guide's store: each reads the other's rows" do
      seed = ActiveRecordIdempotencyStore.new(worker: "seed-1")
      expect(seed.first_time?("shared")).to be(true)
      expect(store.first_time?("shared")).to be(false)
      expect(store.confirmed?("shared")).to be(false)
      age_claim("shared", by: 301)
      expect(store.first_time?("shared")).to be(true)
      store.confirm("shared")
      expect(seed.first_time?("shared")).to be(false)
      expect(seed.purge_expired).to eq(0)
    end

    it "confirms in the handler's ActiveRecord transaction: a rollback takes the confirm with it" do
      store.first_time?("tx")
      ActiveRecord::Base.transaction do
        store.confirm("tx")
        expect(store.confirmed?("tx")).to be(true) # same connection, same transaction
        raise ActiveRecord::Rollback
      end
      expect(store.confirmed?("tx")).to be(false)
      ActiveRecord::Base.transaction { store.confirm("tx") }
      expect(store.confirmed?("tx")).to be(true)
    end

    it "claims without aborting the caller's transaction when the key is taken (ON CONFLICT, not a caught violation)" do
      other.first_time?("taken")
      ActiveRecord::Base.transaction do
        expect(store.first_time?("taken")).to be(false)
        HandledMessage.where(message_id: "taken").update_all(claimed_by: "still-usable")
      end
      expect(row("taken").claimed_by).to eq("still-usable")
    end

    it "says which table and what to check when the table is missing" do
      missing = AceMQ::Rails::ActiveRecordIdempotencyStore.new(table: "acemq_no_such_table")
      expect { missing.first_time?("k") }
        .to raise_error(AceMQ::AMQP::StoreError, /acemq_no_such_table.*migration/m)
    end

    it "refuses options that cannot work, saying what to give" do
      expect { AceMQ::Rails::ActiveRecordIdempotencyStore.new(claim_timeout: 0) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /claim_timeout: must be more than 0/)
      expect { AceMQ::Rails::ActiveRecordIdempotencyStore.new(worker: "w" * 65) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /1 to 64/)
      expect { AceMQ::Rails::ActiveRecordIdempotencyStore.new(model: HandledMessage, table: "t") }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /not both/)
      expect { AceMQ::Rails::ActiveRecordIdempotencyStore.new(table: "x; DROP TABLE y") }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /plain table name/)
    end

    it "works on the application's own model (model: HandledMessage)" do
      own = AceMQ::Rails::ActiveRecordIdempotencyStore.new(model: HandledMessage, worker: "w-9")
      expect(own.first_time?("m")).to be(true)
      expect(own.table).to eq("acemq_idempotency")
      expect(HandledMessage.find("m").claimed_by).to eq("w-9")
    end

    it "writes the migration's datetimes in UTC, the way ActiveRecord reads them back" do
      before = Time.now.utc
      store.first_time?("when")
      row = HandledMessage.find("when")
      expect(row.recorded_at).to be_within(2).of(before)
      expect(row.expires_at - row.recorded_at).to be_within(1).of(store.retention)
    end

    it "refuses an application on default_timezone :local, whose datetimes would disagree by the offset" do
      holder = ActiveRecord.respond_to?(:default_timezone=) ? ActiveRecord : ActiveRecord::Base
      was = holder.default_timezone
      holder.default_timezone = :local
      expect { AceMQ::Rails::ActiveRecordIdempotencyStore.new.first_time?("k") }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /default_timezone is :local.*= :utc/)
    ensure
      holder.default_timezone = was
    end

    it "defaults worker to hostname:pid, read at each call" do
      expect(AceMQ::Rails::ActiveRecordIdempotencyStore.new.worker).to eq("#{Socket.gethostname}:#{Process.pid}")
    end

    it "under Patterns.idempotent: runs once, retries really run, duplicates are accepted, batches too" do
      runs = Hash.new(0)
      guarded = Patterns.idempotent(store) do |m|
        runs[m.envelope.id] += 1
        runs[m.envelope.id] == 1 && m.payload["fail_first"] ? Ack.retry("first try fails") : Ack.accept
      end

      expect(guarded.call(ActiveRecordStoresSpec.message("m-1", "fail_first" => true))).to be_retry
      expect(row("m-1")).to be_nil # forgotten, so the retry runs
      expect(guarded.call(ActiveRecordStoresSpec.message("m-1"))).to be_accept
      expect(guarded.call(ActiveRecordStoresSpec.message("m-1"))).to be_accept
      expect(runs["m-1"]).to eq(2)
      expect(store.confirmed?("m-1")).to be(true)

      # A batch asks a store of ours for first_time? and confirm key by key
      # (it has no first_time_many); each message is decided as alone.
      results = guarded.call_many(%w[b-1 b-2 b-1 m-1].map { |id| ActiveRecordStoresSpec.message(id) })
      expect(results.map { |r| r.kind.to_s }).to eq(%w[accept accept wait accept]) # the same key again: it waits
      expect(results[2].reason).to match(/claimed by a handler that has not finished/)
      expect(runs.values_at("b-1", "b-2")).to eq([1, 1])
      expect(%w[b-1 b-2].map { |k| store.confirmed?(k) }).to eq([true, true])
      expect(guarded.stats).to include(runs: 4, duplicates: 2, in_progress: 1, confirmed: 3, forgotten: 1)
    end

    it "keys on the payload without collapsing a missing field onto one key" do
      runs = []
      collapsing = Patterns.idempotent(store, key: ->(m) { "charge:#{m.payload['order_id']}" }) do |m|
        runs << m.envelope.id
        Ack.accept
      end
      keyed = Patterns.idempotent(store, key: ->(m) { id = m.payload["order_id"] and "refund:#{id}" }) do |m|
        runs << m.envelope.id
        Ack.accept
      end

      # Interpolation is never nil: two messages without an order_id are one
      # key, "charge:", and the second is taken for a duplicate.
      2.times { |i| expect(collapsing.call(ActiveRecordStoresSpec.message("c-#{i}", {}))).to be_accept }
      expect(runs).to eq(["c-0"])
      expect(store.confirmed?("charge:")).to be(true)

      # `id = … and "…#{id}"` is nil when the field is: the guard rejects it.
      missing = keyed.call(ActiveRecordStoresSpec.message("r-0", {}))
      expect(missing).to be_reject
      expect(missing.error_class).to eq("AceMQ::AMQP::FatalError")
      expect(keyed.call(ActiveRecordStoresSpec.message("r-1", "order_id" => "A-7"))).to be_accept
      expect(store.confirmed?("refund:A-7")).to be(true)
      expect(runs).to eq(%w[c-0 r-1])
    end

    it "two processes racing first_time? on one key: exactly one wins, every round" do
      disconnect_before_fork
      config = @ar_config
      wins = race_first_time(20) do
        ActiveRecord::Base.establish_connection(config)
        AceMQ::Rails::ActiveRecordIdempotencyStore.new
      end
      expect(wins.size).to eq(20)
      expect(wins.values.uniq).to eq([1])
      expect(HandledMessage.where(state: "CLAIMED").count).to eq(20)
    end
  end

  # A consumer process SIGKILLed while its handler runs, then the broker's
  # redelivery of the same message to another worker.
  RSpec.shared_examples "a consumer killed mid-handler" do
    def kill_mid_handler(message, &build_store)
      disconnect_before_fork
      config = @ar_config
      pid, out = spawn_child do |o|
        ActiveRecord::Base.establish_connection(config)
        never, held = IO.pipe # held: the write end, kept open (a collected IO closes, and read returns)
        Patterns.idempotent(build_store.call) do |_m|
          o.puts("started")
          never.read # until SIGKILL
        end.call(message)
        held.close
      end
      expect(read_line(out)).to eq("started")
      Process.kill(:KILL, pid)
      wait_child(pid)
      pid
    end

    let(:message) { ActiveRecordStoresSpec.message("killed-#{SecureRandom.hex(4)}") }

    it "the guide's store: the redelivery is accepted without running (the guide store's known loss)" do
      child = kill_mid_handler(message) { ActiveRecordIdempotencyStore.new }
      runs = 0
      guarded = Patterns.idempotent(ActiveRecordIdempotencyStore.new) { runs += 1; Ack.accept }

      expect(guarded.call(message)).to be_accept
      expect(runs).to eq(0)
      expect(guarded.stats).to include(duplicates: 1, in_progress: 0)
      # Settled and gone from the queue, its work never done, and the row
      # still CLAIMED by the dead worker: nothing will bring it back.
      expect(HandledMessage.find(message.envelope.id))
        .to have_attributes(state: "CLAIMED", claimed_by: "#{Socket.gethostname}:#{child}")
    end

    it "the shipped store, its worker on this host: the dead worker's claim is taken over at once, and runs once" do
      child = kill_mid_handler(message) { AceMQ::Rails::ActiveRecordIdempotencyStore.new }
      expect(HandledMessage.find(message.envelope.id))
        .to have_attributes(state: "CLAIMED", claimed_by: "#{Socket.gethostname}:#{child}")
      runs = 0
      guarded = Patterns.idempotent(AceMQ::Rails::ActiveRecordIdempotencyStore.new) { runs += 1; Ack.accept }

      expect(guarded.call(message)).to be_accept
      expect(guarded.call(message)).to be_accept
      expect(runs).to eq(1)
      expect(guarded.stats).to include(in_progress: 0, runs: 1, duplicates: 1, confirmed: 1)
      expect(HandledMessage.find(message.envelope.id))
        .to have_attributes(state: "CONFIRMED", claimed_by: "#{Socket.gethostname}:#{Process.pid}")
    end

    # A worker id that is not this host's hostname:pid (a runner on another
    # host) is never proof of death: its claim is waited out.
    it "the shipped store, its worker elsewhere: the redelivery waits (no attempt spent), and runs once when the claim goes stale" do
      kill_mid_handler(message) { AceMQ::Rails::ActiveRecordIdempotencyStore.new(worker: "another-host:4242") }
      runs = 0
      guarded = Patterns.idempotent(AceMQ::Rails::ActiveRecordIdempotencyStore.new) { runs += 1; Ack.accept }

      retried = guarded.call(message)
      expect(retried).to be_wait
      expect(retried.up_to).to eq(AceMQ::Rails::ActiveRecordIdempotencyStore.new.claim_timeout.to_f)
      expect(retried.reason).to match(/claimed by a handler that has not finished/)
      expect(runs).to eq(0)

      age_claim(message.envelope.id, by: 301)
      expect(guarded.call(message)).to be_accept
      expect(guarded.call(message)).to be_accept
      expect(runs).to eq(1)
      expect(guarded.stats).to include(in_progress: 1, runs: 1, duplicates: 1, confirmed: 1)
      expect(HandledMessage.find(message.envelope.id).state).to eq("CONFIRMED")
    end
  end

  # The same with real consumers on RabbitMQ: the broker redelivers the dead
  # process's unacknowledged message to a consumer in this one.
  RSpec.shared_examples "a RabbitMQ consumer killed mid-handler" do
    let(:queue) { unique("ar-killed") }
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
    let(:charged) { Queue.new }

    before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }

    after do
      @sub&.cancel
      mq.close
    end

    def consumer_killed_mid_handler(&build_store)
      disconnect_before_fork
      config = @ar_config
      queue_name = queue
      pid, out = spawn_child do |o|
        ActiveRecord::Base.establish_connection(config)
        never, held = IO.pipe # held: the write end, kept open (a collected IO closes, and read returns)
        conn = AceMQ::AMQP::Connection.open(AMQP_URL)
        conn.consume(queue_name, &Patterns.idempotent(build_store.call) do |m|
          o.puts("started #{m.envelope.id}")
          never.read # until SIGKILL
        end)
        o.puts("consuming")
        never.read
        held.close
      end
      expect(read_line(out)).to eq("consuming")
      envelope = mq.publish({ "order_id" => "K-1" }, to: queue)
      expect(read_line(out)).to eq("started #{envelope.id}")
      Process.kill(:KILL, pid)
      wait_child(pid)
      envelope
    end

    def consume(store)
      guarded = Patterns.idempotent(store) do |m|
        charged << m.envelope.id
        Ack.accept
      end
      @sub = mq.consume(queue, concurrency: 2, retries: { max_attempts: 60, initial_delay: 0.1, max_delay: 0.2 },
                               &guarded)
      guarded
    end

    it "the guide's store: the redelivered message is acknowledged and never charged" do
      envelope = consumer_killed_mid_handler { ActiveRecordIdempotencyStore.new }
      guarded = consume(ActiveRecordIdempotencyStore.new)

      eventually(timeout: 10) { @sub.stats[:accepted] == 1 }
      expect(charged.size).to eq(0)
      expect(guarded.stats[:duplicates]).to eq(1)
      expect(HandledMessage.find(envelope.id).state).to eq("CLAIMED")
    end

    it "the shipped store, its worker on this host: the dead worker's claim is taken over at once, charged once" do
      envelope = consumer_killed_mid_handler { AceMQ::Rails::ActiveRecordIdempotencyStore.new }
      guarded = consume(AceMQ::Rails::ActiveRecordIdempotencyStore.new)

      eventually(timeout: 15) { HandledMessage.find(envelope.id).state == "CONFIRMED" }
      eventually(timeout: 5) { @sub.stats[:accepted] == 1 }
      expect(Array.new(charged.size) { charged.pop }).to eq([envelope.id])
      expect(guarded.stats).to include(in_progress: 0, runs: 1)
      expect(@sub.stats[:dead_lettered]).to eq(0)
    end

    it "the shipped store, its worker elsewhere: the redelivery climbs the ladder until the claim is stale, then is charged once" do
      # 3 s: long enough that the redelivery meets the claim live on a
      # loaded machine (with 1 s it was sometimes stale already, on MariaDB).
      envelope = consumer_killed_mid_handler do
        AceMQ::Rails::ActiveRecordIdempotencyStore.new(claim_timeout: 3, worker: "another-host:4242")
      end
      guarded = consume(AceMQ::Rails::ActiveRecordIdempotencyStore.new(claim_timeout: 3))

      eventually(timeout: 15) { HandledMessage.find(envelope.id).state == "CONFIRMED" }
      eventually(timeout: 5) { @sub.stats[:accepted] == 1 }
      expect(Array.new(charged.size) { charged.pop }).to eq([envelope.id])
      expect(guarded.stats[:in_progress]).to be >= 1
      expect(@sub.stats[:dead_lettered]).to eq(0)
    end
  end

  RSpec.describe "the Rails stores' files without ActiveRecord" do
    it "load without loading ActiveRecord, and say what is missing when used" do
      require "open3"
      require "rbconfig"
      script = <<~RUBY
        require "acemq/rails/active_record_idempotency_store"
        require "acemq/rails/outbox"
        puts defined?(ActiveRecord).inspect
        begin
          AceMQ::Rails::ActiveRecordIdempotencyStore.new
        rescue AceMQ::AMQP::ConfigurationError => e
          puts e.message
        end
      RUBY
      out, status = Open3.capture2e(RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-e", script)
      expect(status).to be_success, out
      expect(out.lines.first.chomp).to eq("nil")
      expect(out).to include('ActiveRecord, which is not loaded: require "active_record" first')
    end
  end

  RSpec.describe "ActiveRecord idempotency stores on SQLite" do
    before { @ar_config = establish_active_record(:sqlite) }

    def sqlite? = true

    it_behaves_like "the shipped ActiveRecord idempotency store"
    it_behaves_like "a consumer killed mid-handler"
    it_behaves_like "a RabbitMQ consumer killed mid-handler"
  end

  RSpec.describe "ActiveRecord idempotency stores on PostgreSQL", skip: postgres_skip do
    before { @ar_config = establish_active_record(:postgres) }

    def sqlite? = false

    it_behaves_like "the shipped ActiveRecord idempotency store"
    it_behaves_like "a consumer killed mid-handler"
    it_behaves_like "a RabbitMQ consumer killed mid-handler"
  end

  # The guide's migration as written (a VARCHAR key, DATETIME in seconds) on
  # MariaDB through ActiveRecord's mysql2 adapter, which counts found rows:
  # the engine claims key by key there, INSERT IGNORE then the takeover
  # (core/src/idempotency/statements.rs), so no claim has to find the
  # whole-second times it wrote.
  RSpec.describe "ActiveRecord idempotency stores on MariaDB (mysql2)" do
    before { @ar_config = establish_active_record(:mysql) }

    def sqlite? = false
    def mysql? = true

    it_behaves_like "the shipped ActiveRecord idempotency store"
    it_behaves_like "a consumer killed mid-handler"
    it_behaves_like "a RabbitMQ consumer killed mid-handler"

    it "claims inside the caller's transaction without undoing it when the key is taken" do
      store = AceMQ::Rails::ActiveRecordIdempotencyStore.new(worker: "w-1")
      store.first_time?("taken")
      ActiveRecord::Base.transaction do
        HandledMessage.create!(message_id: "work", state: "CONFIRMED", claimed_by: "x", recorded_at: Time.now.utc,
                               expires_at: Time.now.utc + 60)
        expect(store.first_time?("taken")).to be(false)
      end
      expect(HandledMessage.exists?("work")).to be(true)
    end
  end
end
