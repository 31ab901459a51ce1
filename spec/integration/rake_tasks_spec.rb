# frozen_string_literal: true

require "open3"
require "tmpdir"
require "sqlite3"
require "acemq/amqp/patterns"

# The rake tasks as a Rakefile meets them: a fresh process that requires the
# task file and nothing else, with and without a block.
RSpec.describe "the rake tasks in a plain Rakefile" do
  LIB = File.expand_path("../../lib", __dir__)

  def rake(dir, rakefile, *args, env: {})
    File.write(File.join(dir, "Rakefile"), rakefile)
    Open3.capture2e(env, RbConfig.ruby, "-I", LIB, "-S", "rake", "-f", File.join(dir, "Rakefile"), *args, chdir: dir)
  end

  it "purges with a block that builds a store, the Rakefile requiring only acemq/rake_tasks" do
    Dir.mktmpdir do |dir|
      out, status = rake(dir, <<~RUBY, "acemq:purge_idempotency")
        require "acemq/rake_tasks"
        AceMQ::RakeTasks.install_idempotency_purge do
          AceMQ::AMQP::Patterns::SQLIdempotencyStore.new(path: "payments.db").tap(&:create_schema)
        end
      RUBY
      expect(status).to be_success, out
      expect(out).to eq("removed 0 expired keys\n")
    end
  end

  it "purges without a block from ACEMQ_IDEMPOTENCY_PATH" do
    Dir.mktmpdir do |dir|
      path = File.join(dir, "keys.db")
      AceMQ::AMQP::Patterns::SQLIdempotencyStore.new(path: path).create_schema
      out, status = rake(dir, %(require "acemq/rake_tasks"\nAceMQ::RakeTasks.install_idempotency_purge\n),
                         "acemq:purge_idempotency", env: { "ACEMQ_IDEMPOTENCY_PATH" => path })
      expect(status).to be_success, out
      expect(out).to eq("removed 0 expired keys\n")
    end
  end

  it "reports the outbox backlog with its failing rows, with and without a block" do
    Dir.mktmpdir do |dir|
      path = File.join(dir, "outbox.db")
      mq = AceMQ::AMQP::Connection.open(memory_url)
      store = AceMQ::AMQP::Patterns::SQLOutboxStore.new(path: path)
      store.create_schema
      db = SQLite3::Database.new(path)
      store.add(AceMQ::AMQP::Patterns.record(mq, { "n" => 1 }, to: "k", exchange: "missing-exchange"), connection: db)
      AceMQ::AMQP::Patterns::OutboxRelay.new(mq, store, on_error: ->(*, **) {}).sweep
      db.close
      mq.close

      with_block = %(require "acemq/tasks/outbox"\nAceMQ::OutboxTasks.install { AceMQ::AMQP::Patterns::SQLOutboxStore.new(path: #{path.inspect}) }\n)
      without = %(require "acemq/tasks/outbox"\nAceMQ::OutboxTasks.install\n)
      [[with_block, {}], [without, { "ACEMQ_OUTBOX_PATH" => path }]].each do |rakefile, env|
        out, status = rake(dir, rakefile, "acemq:outbox:backlog", env: env)
        expect(status).to be_success, out
        expect(out).to include("1 waiting", "1 failing", "missing-exchange/k attempts=1 next=20")
      end
    end
  end
end
