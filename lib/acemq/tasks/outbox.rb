# frozen_string_literal: true

require "rake"
require "time" # Time#iso8601 for the failing rows
require "acemq/rake_tasks"

module AceMQ
  # The outbox's operator task, for any Rakefile (Rails or not):
  #
  #   require "acemq/tasks/outbox"
  #   AceMQ::OutboxTasks.install { AceMQ::AMQP::Patterns::SQLOutboxStore.new(connection: PG.connect(ENV["DATABASE_URL"])) }
  #
  # then `rake acemq:outbox:backlog` prints how many rows wait, how long the
  # oldest has, and the rows that keep failing with their last error.
  # Without a block it opens the SQLite file named by ACEMQ_OUTBOX_PATH, table
  # ACEMQ_OUTBOX_TABLE (default acemq_outbox). ACEMQ_OUTBOX_MAX_AGE=seconds
  # makes it fail (exit 1) when the oldest row is older, or any row is stuck,
  # so a cron job or a health check can alert on it.
  module OutboxTasks
    extend Rake::DSL

    # Define acemq:outbox:backlog (or name:). The block builds the store each
    # time the task runs. Returns the task.
    def self.install(name: "acemq:outbox:backlog", out: $stdout, &store_builder)
      store_builder ||= method(:store_from_env)
      desc "Show the outbox backlog: rows waiting, the oldest age, and stuck rows with their last error"
      task(name) do
        store = store_builder.call
        report = backlog_report(store)
        out.puts(report[:text])
        abort("acemq: outbox backlog past ACEMQ_OUTBOX_MAX_AGE") if report[:alarm]
      end
    end

    # The text the task prints, and whether ACEMQ_OUTBOX_MAX_AGE is passed.
    def self.backlog_report(store, max_age: ENV.fetch("ACEMQ_OUTBOX_MAX_AGE", nil), limit: 20)
      b = store.backlog
      age = b.oldest_age ? format("%.1fs", b.oldest_age) : "-"
      lines = ["outbox #{store.table}: #{b.count} waiting, oldest #{age}, #{b.stuck} failing"]
      store.stuck(limit).each do |row|
        lines << "  ##{row.id} #{row.exchange.empty? ? '(default)' : row.exchange}/#{row.routing_key} " \
                 "attempts=#{row.attempts} next=#{row.next_attempt_at.utc.iso8601}: #{row.last_error}"
      end
      alarm = max_age && (b.stuck.positive? || (b.oldest_age || 0) > Float(max_age))
      { text: lines.join("\n"), alarm: alarm ? true : false, backlog: b }
    end

    def self.store_from_env
      RakeTasks.sqlite_store_from_env(AceMQ::AMQP::Patterns::SQLOutboxStore, path_var: "ACEMQ_OUTBOX_PATH",
                                      table_var: "ACEMQ_OUTBOX_TABLE", task: "acemq:outbox:backlog",
                                      installer: "OutboxTasks.install")
    end
    private_class_method :store_from_env
  end
end
