# app/models/handled_message.rb
class HandledMessage < ApplicationRecord
  self.table_name = "acemq_idempotency"
  self.primary_key = "message_id"
end
