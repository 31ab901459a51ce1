# frozen_string_literal: true

require "rake"
# The tasks' blocks build stores: the patterns must be loaded for them, and
# a Rakefile should not have to know that.
require "acemq/amqp/patterns"

module AceMQ
  # Rake tasks for an application without Rails (a Rails application gets the
  # same from the Railtie). In a Rakefile:
  #
  #   require "acemq/rake_tasks"
  #   AceMQ::RakeTasks.install_idempotency_purge do
  #     AceMQ::AMQP::Patterns::SQLIdempotencyStore.new(path: "payments.db")
  #   end
  #
  # then schedule `rake acemq:purge_idempotency` (hourly, say). Without a
  # block the task opens the SQLite file named by ACEMQ_IDEMPOTENCY_PATH,
  # with the table in ACEMQ_IDEMPOTENCY_TABLE (default acemq_idempotency).
  module RakeTasks
    extend Rake::DSL

    # Define acemq:purge_idempotency (or name:). The block builds the store
    # each time the task runs — anything answering purge_expired, so the
    # guide's ActiveRecordIdempotencyStore works too. Returns the task.
    def self.install_idempotency_purge(name: "acemq:purge_idempotency", &store_builder)
      store_builder ||= method(:store_from_env)
      desc "Remove idempotency keys past their retention"
      task(name) do
        # Nothing on the handling path deletes a key (a delete there is
        # contention on the one table every message touches), so this is what
        # keeps the table from growing by one row per message for ever.
        removed = store_builder.call.purge_expired
        puts "removed #{removed} expired keys"
      end
    end

    # The store a task opens when it was given no block: the SQLite file
    # named by the environment variable path_var, table from table_var.
    def self.sqlite_store_from_env(store_class, path_var:, table_var:, task:, installer:)
      path = ENV.fetch(path_var) do
        raise AceMQ::AMQP::ConfigurationError,
              "#{task} needs a store: pass #{installer} a block that builds one, or set #{path_var} to the SQLite file"
      end
      store_class.new(path: path, table: ENV.fetch(table_var, nil))
    end

    def self.store_from_env
      sqlite_store_from_env(AceMQ::AMQP::Patterns::SQLIdempotencyStore, path_var: "ACEMQ_IDEMPOTENCY_PATH",
                            table_var: "ACEMQ_IDEMPOTENCY_TABLE", task: "acemq:purge_idempotency",
                            installer: "install_idempotency_purge")
    end
    private_class_method :store_from_env
  end
end
