# frozen_string_literal: true

require "acemq/rails"
require "json"
require "rbconfig"
require "tmpdir"

# The throttle shared across processes (issue 36 part 3): separate processes,
# each with its own broker connection and its own database connection, take
# one queue with `throttle: { limit: 20, per: 1, store: }`; between them they
# hand out at most the limit per window of the store, and every message is
# handled. The window and lease arithmetic is core's (core/src/throttle.rs).
RSpec.describe "throttle shared across processes" do
  let(:limit) { 20 }
  let(:lease) { 2 } # core's lease_size(20): a tenth of the limit

  # One consumer process: handles the queue, writing "epoch-seconds id" per
  # message to its own file; runs until killed.
  child = <<~'RUBY'
    require "acemq/amqp"
    amqp, queue, name, limit, out, kind, db = ARGV
    store = case kind
            when "postgres" then require "pg"; PG.connect(db).tap { |c| c.set_notice_processor { nil } }
            when "sqlite" then require "sqlite3"; SQLite3::Database.new(db).tap { |d| d.busy_timeout = 2000 }
            end
    mq = AceMQ::AMQP::Connection.open(amqp)
    log = File.open(out, "a").tap { |f| f.sync = true }
    lock = Mutex.new
    mq.consume(queue, concurrency: 2, name: name, throttle: { limit: Integer(limit), per: 1, store: store }) do |m|
      lock.synchronize { log.puts("#{Time.now.to_f} #{m.payload["n"]}") }
      AceMQ::AMQP::Ack.accept
    end
    $stdout.puts "ready"
    sleep
  RUBY
  let(:child) { child }

  def run_shared(kind, db, processes:, messages:)
    queue = unique("shared-throttle")
    name = unique("shared-throttle-consumer")
    mq = AceMQ::AMQP::Connection.open(AMQP_URL)
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    messages.times { |n| mq.publish({ "n" => n }, to: queue) }
    Dir.mktmpdir do |dir|
      lib = File.expand_path("../../lib", __dir__)
      pids = Array.new(processes) do |i|
        Process.spawn(RbConfig.ruby, "-I", lib, "-e", child, AMQP_URL, queue, name, limit.to_s,
                      File.join(dir, "#{i}.log"), kind, db, out: File::NULL, pgroup: true)
      end
      lines = -> { Dir[File.join(dir, "*.log")].flat_map { |f| File.readlines(f) } }
      begin
        eventually(timeout: 15) { lines.call.size >= messages }
        sleep 0.3 # nothing more (a message handled twice) arrives
      ensure
        pids.each { |pid| Process.kill("KILL", -pid) rescue nil } # rubocop:disable Style/RescueModifier
        pids.each { |pid| Process.wait(pid) rescue nil } # rubocop:disable Style/RescueModifier
      end
      handled = lines.call.map(&:split)
      ids = handled.map { |_, n| Integer(n) }
      expect(ids.sort).to eq((0...messages).to_a) # all, none twice
      per_window = handled.group_by { |t, _| Float(t).floor }.transform_values(&:size)
      # The store grants at most the limit per window; a handler starts a moment
      # after its token was taken, so a token taken at a window's end may be
      # logged in the next: at most one lease per process.
      expect(per_window.values.max).to be <= limit + (processes * lease), per_window.inspect
      # Three processes each limited to 20 locally would do 60 in a window.
      expect(per_window.size).to be >= (messages / (limit + (processes * lease)).to_f).ceil
      yield name if block_given?
    end
  ensure
    mq&.close
  end

  it "hands out at most the limit per window between three processes sharing PostgreSQL, and loses nothing" do
    require "pg"
    run_shared("postgres", DATABASE_URL, processes: 3, messages: 100) do |name|
      pg = PG.connect(DATABASE_URL)
      row = pg.exec_params("SELECT taken FROM acemq_throttle WHERE name = $1", [name]).first
      expect(Integer(row["taken"])).to be_between(1, limit)
      pg.exec_params("DELETE FROM acemq_throttle WHERE name = $1", [name])
      pg.close
    end
  end

  it "does the same over one SQLite file shared by two processes" do
    Dir.mktmpdir do |dir|
      run_shared("sqlite", File.join(dir, "throttle.db"), processes: 2, messages: 50)
    end
  end

  # An adapter of the seam's three methods over SQLite that fails its first
  # `failures` statements, as a database that is down would.
  class FlakySQLite
    attr_reader :calls

    def initialize(failures)
      require "sqlite3"
      @db = SQLite3::Database.new(":memory:")
      @failures = failures
      @calls = 0
    end

    def dialect = "sqlite"

    def execute(sql, params)
      fail_maybe
      @db.execute(sql, params)
      @db.changes
    end

    def query(sql, params)
      fail_maybe
      @db.execute(sql, params)
    end

    private

    def fail_maybe
      @calls += 1
      return unless @failures.positive?

      @failures -= 1
      raise IOError, "database is down"
    end
  end

  it "hands nothing out while its store fails, says so, and goes on when it answers, losing nothing" do
    queue = unique("throttle-outage")
    mq = AceMQ::AMQP::Connection.open(AMQP_URL)
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    3.times { |n| mq.publish({ "n" => n }, to: queue) }
    events = []
    listener = AceMQ.subscribe("subscription.acemq") { |e| events << e[:reason] if e[:state] == "throttle_store_failed" && e[:queue] == queue }
    seen = []
    store = FlakySQLite.new(2)
    sub = mq.consume(queue, throttle: { limit: 10, per: 1, store: store }) do |m|
      seen << m.payload["n"]
      AceMQ::AMQP::Ack.accept
    end
    eventually(timeout: 10) { seen.size == 3 }
    expect(seen).to eq([0, 1, 2])
    expect(events.size).to eq(2)
    expect(events.first).to include("IOError: database is down")
    expect(sub.stats[:dead_lettered]).to eq(0)
    sub.cancel
  ensure
    AceMQ.unsubscribe(listener) if listener
    mq&.close
  end

  it "takes store: in a consumer class and refuses a store it cannot drive" do
    db = Object.new
    def db.dialect = "sqlite"
    def db.execute(*) = 0
    def db.query(*) = []
    klass = Class.new(AceMQ::Rails::Consumer) do
      queue "orders"
      throttle 20, per: 1, store: db
    end
    expect(klass.throttle).to eq(limit: 20, per: 1.0, store: db)
    mq = AceMQ::AMQP::Connection.open(AMQP_URL)
    queue = unique("throttle-bad-store")
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    expect { mq.consume(queue, throttle: { limit: 5, store: Object.new }) { nil } }
      .to raise_error(AceMQ::AMQP::SQL::UnsupportedConnection, /cannot use Object as a SQL connection/)
    expect { mq.consume(queue, throttle: { limit: 5, stor: db }) { nil } }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /store: \(a SQL connection/)
  ensure
    mq&.close
  end
end
