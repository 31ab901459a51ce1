# frozen_string_literal: true

# The guide's ActiveRecord application code — its ApplicationRecord,
# migration, HandledMessage and ActiveRecordIdempotencyStore, verbatim — has
# one home: the Rails application in spec/dummy, where it runs as the guide
# prints it. Specs that want it without booting Rails load those same files
# on demand, so a run that never asks never loads ActiveRecord.
module SeedApp
  DUMMY = File.expand_path("../dummy", __dir__)
  FILES = %w[app/models/application_record.rb db/migrate/20260926000100_create_acemq_idempotency.rb
             app/models/handled_message.rb app/models/active_record_idempotency_store.rb].freeze

  def self.load!
    require "active_record"
    require "socket"
    ActiveRecord::Migration.verbose = false
    @load ||= Mutex.new
    @load.synchronize do
      next if defined?(::ActiveRecordIdempotencyStore)

      FILES.each { |f| load File.join(DUMMY, f) }
    end
  end
end
