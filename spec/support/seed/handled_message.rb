# frozen_string_literal: true

# The guide's model, verbatim; loaded by SeedApp.load! once ActiveRecord is.
return unless defined?(ApplicationRecord)

# app/models/handled_message.rb
class HandledMessage < ApplicationRecord
  self.table_name = "acemq_idempotency"
  self.primary_key = "message_id"
end
