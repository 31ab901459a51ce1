# frozen_string_literal: true

require "tmpdir"

# SQLDeadLetterStore.resolve: the one reading of a dead_letter_store setting,
# the runner's (AceMQ::Rails.dead_letter_store) and the dashboard's, and
# SQL.open_url's refusals. No broker, no server: SQLite files.
RSpec.describe "AceMQ::AMQP::SQLDeadLetterStore.resolve" do
  let(:klass) { AceMQ::AMQP::SQLDeadLetterStore }
  let(:dir) { Dir.mktmpdir("acemq-resolve") }

  after { FileUtils.rm_rf(dir) }

  it "takes a store as it is, calls a callable, opens a SQLite path, and is nil for nil" do
    store = klass.new(path: File.join(dir, "a.db"))
    expect(klass.resolve(store)).to equal(store)
    expect(klass.resolve(-> { store })).to equal(store)
    expect(klass.resolve(nil)).to be_nil
    opened = klass.resolve(File.join(dir, "b.db"))
    opened.create_schema
    expect(opened.counts[:total]).to eq(0)
    expect(File.exist?(File.join(dir, "b.db"))).to be(true)
  end

  it "refuses what is no store, naming what it takes" do
    expect { klass.resolve(:nope) }.to raise_error(AceMQ::AMQP::ConfigurationError, /a callable returning one, :active_record/)
    expect { klass.resolve(-> { 42 }) }.to raise_error(AceMQ::AMQP::ConfigurationError, /got 42/)
  end

  it "opens only postgres:// and mysql2:// URLs, and never prints a password" do
    expect(AceMQ::AMQP::SQL.url?("postgres://u@h/db")).to be(true)
    expect(AceMQ::AMQP::SQL.url?("mysql2://u@h/db")).to be(true)
    expect(AceMQ::AMQP::SQL.url?("/var/lib/dead.db")).to be(false)
    expect { AceMQ::AMQP::SQL.open_url("redis://u:secret@h/0") }
      .to raise_error(AceMQ::AMQP::ConfigurationError) do |e|
        expect(e.message).to include("postgres://")
        expect(e.message).not_to include("secret")
      end
  end
end
