# db/migrate/20260926000100_create_acemq_idempotency.rb
# The guide's Migration[7.1] wherever Rails knows 7.1 (7.1 and later: Rails
# 7.2 runs it with 7.1's behaviour, as the guide's reader gets); Rails 6.1
# refuses a version newer than itself, so there it is 6.1's own.
class CreateAcemqIdempotency < ActiveRecord::Migration[[7.1, ActiveRecord::Migration.current_version].min]
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
