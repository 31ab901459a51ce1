# frozen_string_literal: true

require "tmpdir"
require "active_record"
require "acemq/rails/active_record_idempotency_store"
require "acemq/rails/outbox"

# kill -9 of a runner charging through the shipped ActiveRecord store on
# PostgreSQL: the broker redelivers what the dead process had not
# acknowledged, and the store turns the second run into one charge.
RSpec.describe "acemq run killed with SIGKILL (PostgreSQL, ActiveRecord store)" do
  include RunnerHelpers

  APP_AR = File.join(RunnerHelpers::ROOT, "spec", "fixtures", "runner_ar_app.rb")

  let(:queue) { unique("runner-crash") }
  let(:origin) { unique("runner-crash-app") }
  let(:charges) { "charges_#{SecureRandom.hex(4)}" }
  let(:keys) { "acemq_idem_#{SecureRandom.hex(4)}" }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("runner-crash-spec")) }
  let(:env) do
    { "QUEUE" => queue, "ORIGIN" => origin, "DATABASE_URL" => DATABASE_URL, "CHARGES_TABLE" => charges,
      "IDEMPOTENCY_TABLE" => keys }
  end

  before do
    ActiveRecord::Base.establish_connection(DATABASE_URL)
    c = ActiveRecord::Base.connection
    c.create_table(charges) { |t| t.string :order_id, null: false }
    c.create_table(keys, id: false) do |t|
      t.string :message_id, null: false, limit: 255, primary_key: true
      t.string :state, null: false, limit: 16
      t.string :claimed_by, limit: 64
      t.datetime :recorded_at, null: false
      t.datetime :expires_at, null: false
    end
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
  end

  after do
    reap_runners
    c = ActiveRecord::Base.connection
    c.drop_table(charges, if_exists: true)
    c.drop_table(keys, if_exists: true)
    mq.close
  end

  it "relays what a handler added to the outbox in its transaction, once" do
    outbox = "acemq_outbox_#{SecureRandom.hex(4)}"
    receipts = unique("receipts")
    AceMQ::AMQP::Topology.new.queue(receipts).apply(mq)
    AceMQ::Rails::Outbox.new(table: outbox).tap(&:create_schema).close
    runner = start_runner(env.merge("OUTBOX_TABLE" => outbox, "RECEIPTS" => receipts), app: APP_AR)
    expect(runner.text).to include("outbox relay")
    got = Queue.new
    sub = mq.consume(receipts) { |m| got << [m.payload["order_id"], m.type]; AceMQ::AMQP::Ack.accept }
    mq.publish({ "order_id" => "C-1" }, to: queue)
    expect(eventually(timeout: 10) { got.pop(true) rescue nil }).to eq(["C-1", "payment.taken.v1"])
    sub.cancel
    # The row goes once the broker has confirmed the publish: just after.
    eventually { ActiveRecord::Base.connection.select_value("SELECT COUNT(*) FROM #{outbox}").to_i.zero? }
    runner.signal("TERM")
    expect(runner.wait(10)).to eq(0)
  ensure
    ActiveRecord::Base.connection.drop_table(outbox, if_exists: true)
  end

  it "refuses to boot when the ActiveRecord pool is smaller than the consumers' threads, saying what to set" do
    pooled = "#{DATABASE_URL}#{DATABASE_URL.include?('?') ? '&' : '?'}pool=1"
    out = IO.popen(env.merge("AMQP_URL" => AMQP_URL, "LOG" => File::NULL, "DATABASE_URL" => pooled),
                   [RbConfig.ruby, "-I", File.join(RunnerHelpers::ROOT, "lib"), RunnerHelpers::EXE, "run", "-r", APP_AR],
                   err: %i[child out], &:read)
    expect($?.exitstatus).to eq(1)
    expect(out).to include("the ActiveRecord pool has 1 connections and the consumers run 2 threads", "set pool: 2")
  end

  def charged(order) = ActiveRecord::Base.connection.select_value("SELECT COUNT(*) FROM #{charges} WHERE order_id = '#{order}'").to_i

  it "charges once when killed mid-handler, before the work committed" do
    first = start_runner(env, app: APP_AR)
    mq.publish({ "order_id" => "A-1", "pause_before" => 30 }, to: queue)
    eventually { first.handled == ["start A-1"] }
    first.signal("KILL")
    expect(first.wait(5)).to eq(137)

    second = start_runner(env, app: APP_AR)
    # The dead worker's claim holds the redelivery back (retried, not
    # accepted unrun) until it goes stale, then this worker takes it over.
    eventually(timeout: 20) { charged("A-1") == 1 }
    eventually { second.handled.include?("charged A-1") }
    expect(charged("A-1")).to eq(1)
    second.signal("TERM")
    expect(second.wait(10)).to eq(0)
  end

  it "charges once when killed after the work committed, before the acknowledgement" do
    first = start_runner(env, app: APP_AR)
    mq.publish({ "order_id" => "B-1", "pause_after" => 30 }, to: queue)
    eventually { first.handled.include?("charged B-1") }
    first.signal("KILL")
    expect(first.wait(5)).to eq(137)

    second = start_runner(env, app: APP_AR)
    mq.publish({ "order_id" => "B-2" }, to: queue) # a message behind it, to know the redelivery was seen
    eventually(timeout: 20) { second.handled.include?("charged B-2") }
    # The redelivery found its key confirmed: accepted without running.
    eventually { ready_count(queue).zero? }
    expect(charged("B-1")).to eq(1)
    expect(second.handled).not_to include("start B-1")
    second.signal("TERM")
    expect(second.wait(10)).to eq(0)
  ensure
    close_bunny
  end
end
