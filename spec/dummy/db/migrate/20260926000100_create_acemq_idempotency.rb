# db/migrate/20260926000100_create_acemq_idempotency.rb
class CreateAcemqIdempotency < ActiveRecord::Migration[ActiveRecord::Migration.current_version]
  def change
    create_table :acemq_idempotency, id: false do |t|
      t.string   :message_id,  null: false, limit: 255, primary_key: true
      t.string   :state,       null: false, limit: 16
      t.string   :claimed_by,  limit: 64
      t.datetime :recorded_at, null: false
      t.datetime :expires_at,  null: false
    end

    add_index :acemq_idempotency, :expires_at, name: "acemq_idempotency_expiry"
  end
end
