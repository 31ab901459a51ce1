# frozen_string_literal: true

# The guide's ActiveRecord application (spec/support/seed/: its
# ApplicationRecord, migration, HandledMessage and ActiveRecordIdempotencyStore,
# verbatim), loaded on demand. The files return at once when spec_helper
# requires them, so a run that never asks for them never loads ActiveRecord.
module SeedApp
  FILES = %w[application_record create_acemq_idempotency handled_message active_record_idempotency_store].freeze

  def self.load!
    require "active_record"
    require "socket"
    ActiveRecord::Migration.verbose = false
    @load ||= Mutex.new
    @load.synchronize do
      next if defined?(::ActiveRecordIdempotencyStore)

      FILES.each { |f| load File.join(__dir__, "seed", "#{f}.rb") }
    end
  end
end
