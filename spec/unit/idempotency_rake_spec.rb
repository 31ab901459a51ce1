# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "acemq/rake_tasks"

RSpec.describe "AceMQ::RakeTasks.install_idempotency_purge" do
  around do |ex|
    previous = Rake.application
    Rake.application = Rake::Application.new
    ex.run
  ensure
    Rake.application = previous
  end

  it "defines a task that runs the store's purge_expired and says how many went" do
    store = Struct.new(:purged) { def purge_expired = (self.purged = true) && 3 }.new(false)
    AceMQ::RakeTasks.install_idempotency_purge { store }

    expect { Rake::Task["acemq:purge_idempotency"].invoke }.to output("removed 3 expired keys\n").to_stdout
    expect(store.purged).to be(true)
  end

  it "without a block, purges the SQLite file named by ACEMQ_IDEMPOTENCY_PATH" do
    path = File.join(Dir.mktmpdir, "purge.sqlite3")
    store = AceMQ::AMQP::Patterns::SQLIdempotencyStore.new(path: path, retention: 0.05)
    store.create_schema
    claimed_at = Time.now
    store.first_time?("k")
    eventually { Time.now > claimed_at + 0.1 } # past the retention

    AceMQ::RakeTasks.install_idempotency_purge(name: "purge")
    ENV["ACEMQ_IDEMPOTENCY_PATH"] = path
    expect { Rake::Task["purge"].invoke }.to output("removed 1 expired keys\n").to_stdout
  ensure
    ENV.delete("ACEMQ_IDEMPOTENCY_PATH")
  end

  it "says what it needs when it has neither a block nor the variable" do
    AceMQ::RakeTasks.install_idempotency_purge
    expect { Rake::Task["acemq:purge_idempotency"].invoke }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /ACEMQ_IDEMPOTENCY_PATH/)
  end
end
