# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "acemq/rails/outbox"

# ActiveRecord as Rails 7.2 and 8.0 hand it out, on SQLite and PostgreSQL:
# a pool without #connection (8.0 removes it; 7.2 deprecates it), and
# ActiveRecord.permanent_connection_checkout = :disallowed, under which
# ActiveRecord::Base.connection raises. Every store and the outbox still
# work, through with_connection and lease_connection. Rails 6.1 has neither
# (its pool lends only through #connection): those examples run on Rails
# 7.2 (bin/rails72-gems), and what runs on 6.1 is the pool's recognition.
module RailsConnectionCheckoutSpec
  Patterns = AceMQ::AMQP::Patterns
  SQL = AceMQ::AMQP::SQL

  def self.postgres_skip = ActiveRecordSpecHelpers.postgres? ? false : "DATABASE_URL is not set"

  # Asked in a before hook, once establish_active_record has loaded
  # ActiveRecord (a run that never asks never loads it).
  def self.lease_skip
    return if ActiveRecord::ConnectionAdapters::ConnectionPool.method_defined?(:lease_connection)

    "Rails #{ActiveRecord.version}'s pool has no lease_connection: it lends only through #connection"
  end

  def self.checkout_skip
    return if ActiveRecord.respond_to?(:permanent_connection_checkout=)

    "Rails #{ActiveRecord.version} has no permanent_connection_checkout"
  end

  RSpec.describe "SQL.connect and a connection pool's shape" do
    # What SQL.connect looks at, without ActiveRecord: the methods.
    def pool_like(*methods)
      Class.new { methods.each { |m| define_method(m) { |*| nil } } }.new
    end

    it "takes a pool that leases with lease_connection and has no #connection (Rails 8.0)" do
      pool = pool_like(:with_connection, :lease_connection, :active_connection?, :release_connection)
      expect(SQL.connect(pool)).to be_a(SQL::ConnectionPool)
    end

    it "takes a pool that leases with #connection only (Rails 6.1 to 7.1)" do
      pool = pool_like(:with_connection, :connection, :active_connection?, :release_connection)
      expect(SQL.connect(pool)).to be_a(SQL::ConnectionPool)
    end

    it "refuses a pool-like object with no way to lease a connection, saying what it accepts" do
      pool = pool_like(:with_connection, :active_connection?, :release_connection)
      expect { SQL.connect(pool) }.to raise_error(SQL::UnsupportedConnection, /with_connection \(an ActiveRecord connection pool\)/)
    end
  end

  RSpec.shared_examples "the stores on Rails 7.2 and 8.0's ActiveRecord" do
    let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
    let(:pool) { ActiveRecord::Base.connection_pool }
    let(:outbox) { AceMQ::Rails::Outbox.new(table: outbox_table("ar_checkout")) }
    let(:orders) { Class.new(ActiveRecord::Base) { self.table_name = "orders" } }
    let(:keys) { Patterns::SQLIdempotencyStore.new(connection: pool, table: "acemq_checkout_keys") }
    let(:shipped) { AceMQ::Rails::ActiveRecordIdempotencyStore.new(worker: "w-1") }

    before do
      ActiveRecord::Base.connection.create_table(:orders, id: false) do |t|
        t.string :id, primary_key: true
        t.integer :total, null: false
      end
      outbox.create_schema
      keys.create_schema
      pool.release_connection
      @queue = unique("checkout")
      AceMQ::AMQP::Topology.new.queue(@queue).apply(mq)
    end

    after do
      outbox.close
      mq.close
    end

    def busy = pool.connections.count(&:in_use?)

    # To a queue that exists: the relay publishes mandatory, and a row the
    # broker cannot route stays in the backlog.
    def record(id) = Patterns.record(mq, { "order_id" => id }, to: @queue, exchange: "")

    def exercise
      # The outbox's add in the caller's transaction: rolled back with it,
      # committed with it; and outside any transaction.
      ActiveRecord::Base.transaction do
        outbox.add(record("R-1"))
        orders.create!(id: "R-1", total: 1)
        raise ActiveRecord::Rollback
      end
      ActiveRecord::Base.transaction do
        orders.create!(id: "C-1", total: 2)
        outbox.add(record("C-1"))
      end
      expect(outbox.add(record("C-2"))).to be_a(Integer)
      expect(outbox.backlog.count).to eq(2)
      expect(orders.count).to eq(1)

      # The SQL seam on the pool: a statement on a lent connection, and a
      # transaction of the engine's own (BEGIN … COMMIT) on a leased one.
      expect(keys.first_time?("k")).to be(true)
      keys.confirm("k")
      expect(keys.confirmed?("k")).to be(true)
      lease = SQL.connect(pool).checkout
      lease.execute(sqlite? ? "BEGIN IMMEDIATE" : "BEGIN", [])
      lease.execute("DELETE FROM acemq_checkout_keys WHERE message_id = $1", ["k"])
      lease.execute("COMMIT", [])
      expect(keys.first_time?("k")).to be(true)

      # The shipped ActiveRecord store.
      expect(shipped.first_time?("s")).to be(true)
      expect(shipped.confirmed?("s")).to be(false)
      shipped.confirm("s")
      expect(shipped.confirmed?("s")).to be(true)
      shipped.forget("s")
      expect(shipped.purge_expired).to eq(0)

      # The relay, on a connection of its own built from ActiveRecord's.
      relay = outbox.relay(mq)
      expect(relay.sweep).to eq(2) # confirmed by the broker
      relay.close
      expect(outbox.backlog.count).to eq(0)
      # Nothing kept a connection. On Rails 6.1 ActiveRecord's own
      # transaction and queries keep the thread's (a permanent checkout);
      # 7.2's give it back, and so must the stores.
      expect(busy).to eq(0) unless RailsConnectionCheckoutSpec.lease_skip
    end

    it "adds to the outbox, relays, claims and confirms keys on this Rails as it comes" do
      exercise
    end

    context "with the pool's #connection gone (Rails 8.0)" do
      # This pool's own method, not the class's: ActiveRecord 7.2 itself
      # leases with lease_connection, so only a caller still asking for
      # #connection notices.
      before do
        reason = RailsConnectionCheckoutSpec.lease_skip
        skip(reason) if reason
        pool.singleton_class.send(:undef_method, :connection)
      end

      it "adds to the outbox, relays, claims and confirms keys, through with_connection and lease_connection" do
        expect(pool).not_to respond_to(:connection)
        expect(SQL.connect(pool)).to be_a(SQL::ConnectionPool)
        exercise
      end
    end

    context "with ActiveRecord.permanent_connection_checkout = :disallowed" do
      before do
        reason = RailsConnectionCheckoutSpec.checkout_skip
        skip(reason) if reason
        @checkout_was = ActiveRecord.permanent_connection_checkout
        ActiveRecord.permanent_connection_checkout = :disallowed
      end

      after { ActiveRecord.permanent_connection_checkout = @checkout_was if defined?(@checkout_was) }

      it "adds to the outbox, relays, claims and confirms keys, never checking out for good" do
        expect { ActiveRecord::Base.connection }.to raise_error(ActiveRecord::ActiveRecordError, /use `with_connection` or `lease_connection`/)
        exercise
      end
    end
  end

  RSpec.describe "The stores under Rails 7.2 and 8.0 on SQLite" do
    before { establish_active_record(:sqlite) }

    def sqlite? = true

    it_behaves_like "the stores on Rails 7.2 and 8.0's ActiveRecord"
  end

  RSpec.describe "The stores under Rails 7.2 and 8.0 on PostgreSQL", skip: RailsConnectionCheckoutSpec.postgres_skip do
    before { establish_active_record(:postgres) }

    def sqlite? = false

    it_behaves_like "the stores on Rails 7.2 and 8.0's ActiveRecord"
  end
end
