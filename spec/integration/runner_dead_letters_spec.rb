# frozen_string_literal: true

require "json"
require "pg"
require "securerandom"

# `acemq run` with c.dead_letter_store: the runner ingests each consumer's
# DLQ into the store, one ingester per DLQ across runners. Each example runs
# runners as child processes against RabbitMQ and PostgreSQL (tables named
# per example) and judges them by the store's rows, the DLQ, /status and the
# log.
RSpec.describe "acemq run with a dead-letter store (processes)" do
  include RunnerHelpers

  app = File.join(RunnerHelpers::ROOT, "spec", "fixtures", "runner_dead_letters_app.rb")

  let(:queue) { unique("runner-dl") }
  let(:table) { "dl_#{SecureRandom.hex(5)}" }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("runner-dl-spec")) }
  let(:pg) { PG.connect(DATABASE_URL).tap { |c| c.set_notice_processor { |_| } } }
  let(:store) do
    AceMQ::AMQP::SQLDeadLetterStore.new(connection: pg, table: table, audit_table: "#{table}_audit").tap(&:create_schema)
  end
  let(:env) do
    { "QUEUE" => queue, "ORIGIN" => unique("runner-dl-app"), "DATABASE_URL" => DATABASE_URL, "DEAD_LETTER_TABLE" => table }
  end

  before { store }

  after do
    reap_runner_groups
    close_bunny
    mq.close
    pg.exec("DROP TABLE IF EXISTS #{table}, #{table}_audit")
    pg.close
  end

  def ingesters(runner) = JSON.parse(runner.health("/status").body)["dead_letters"]
  def state(runner) = ingesters(runner).first&.fetch("state")
  def stored = store.list(queue: queue, limit: 1000).letters

  it "ingests a rejected message through the runner's ingester; a second runner stands by, and takes over when the first stops" do
    first = start_runner(env, app: app)
    eventually(timeout: 20) { state(first) == "ingesting" }
    expect(first.text).to include("acemq: dead letters of #{queue}.dlq into the store", "acemq: ingesting #{queue}.dlq")

    mq.publish({ "n" => 1 }, to: queue)
    eventually(timeout: 20) { stored.size == 1 }
    expect(stored.first).to have_attributes(queue: queue, reason: "spec: 1 declined")

    second = start_runner(env, app: app)
    eventually(timeout: 20) { state(second) == "standby" }
    expect(second.text).to include("#{queue}.dlq is consumed exclusively by another ingester; standing by")
    # A standby is not a failure: the second runner is ready.
    expect(second.health("/ready").code).to eq("200")

    mq.publish({ "n" => 2 }, to: queue)
    eventually(timeout: 20) { stored.size == 2 }
    # /status is brought up to date on the runner's next check.
    eventually(timeout: 10) { ingesters(first).first["received"] == 2 }
    expect(ingesters(first).first).to include("dlq" => "#{queue}.dlq", "state" => "ingesting", "last_error" => nil)
    expect(ingesters(second).first).to include("state" => "standby", "received" => 0)
    expect(ingesters(second).first["last_error"]).to match(/ACCESS_REFUSED|exclusive/i)

    first.signal("TERM")
    expect(first.wait(20)).to eq(0), first.text
    eventually(timeout: 20) { state(second) == "ingesting" }
    expect(second.text).to include("acemq: ingesting #{queue}.dlq")

    mq.publish({ "n" => 3 }, to: queue)
    eventually(timeout: 20) { stored.size == 3 }
    expect(stored.map(&:reason)).to match_array(["spec: 1 declined", "spec: 2 declined", "spec: 3 declined"])
    eventually(timeout: 10) { ingesters(second).first["received"] == 1 }
    expect(ingesters(second).first["last_error"]).to be_nil
    expect(ready_count("#{queue}.dlq")).to eq(0)
  end

  it "takes dead_letter_store = :active_record: the store on ActiveRecord's pool and the migrated tables" do
    # The default tables, as acemq:install's migration makes them (IF NOT
    # EXISTS: other runs may share them; this example's rows are its queue's).
    shared = AceMQ::AMQP::SQLDeadLetterStore.new(connection: pg).tap(&:create_schema)
    runner = start_runner(env.merge("DEAD_LETTER_STORE" => "active_record"), app: app)
    eventually(timeout: 20) { state(runner) == "ingesting" }
    mq.publish({ "n" => 7 }, to: queue)
    eventually(timeout: 20) { shared.counts(queue: queue)[:total] == 1 }
    expect(shared.list(queue: queue).letters.map(&:reason)).to eq(["spec: 7 declined"])
    expect(stored).to be_empty # not the per-example tables the callable would use
  ensure
    shared&.purge(queue: queue, actor: "spec")
  end

  it "keeps the configured retention: dead_letter_max_count rows of the queue, the rest pruned and audited" do
    runner = start_runner(env.merge("DEAD_LETTER_MAX_COUNT" => "2", "DEAD_LETTER_PRUNE_EVERY" => "0.2"), app: app)
    eventually(timeout: 20) { state(runner) == "ingesting" }
    5.times { |n| mq.publish({ "n" => n }, to: queue) }
    eventually(timeout: 20) { ingesters(runner).first["received"] == 5 }
    eventually(timeout: 20) { stored.size == 2 }
    expect(stored.map(&:reason).uniq.size).to eq(2)
    prunes = store.audit(limit: 50).select { _1[:action] == "prune" }
    expect(prunes.sum { _1[:count] }).to eq(3)
    expect(prunes.map { _1[:queue] }.uniq).to eq([queue])
  end

  it "with --processes 2 has one worker ingest and the other stand by" do
    parent = start_runner(env, app: app, args: %w[--processes 2])
    eventually(timeout: 30) { parent.health_port && parent.text.scan("acemq: running").size == 2 }
    states = lambda do
      JSON.parse(parent.health("/status").body)["children"].map { |c| c.dig("runner", "dead_letters", 0, "state") }.sort
    end
    eventually(timeout: 20) { states.call == %w[ingesting standby] }

    mq.publish({ "n" => 1 }, to: queue)
    eventually(timeout: 20) { stored.size == 1 }
    expect(stored.first.reason).to eq("spec: 1 declined")
  end
end
