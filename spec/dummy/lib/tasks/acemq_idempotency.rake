# lib/tasks/acemq_idempotency.rake — hourly
namespace :acemq do
  desc "Remove idempotency keys past their retention"
  task purge_idempotency: :environment do
    puts "removed #{ActiveRecordIdempotencyStore.new.purge_expired} expired keys"
  end
end
