# frozen_string_literal: true

class CreateCharges < ActiveRecord::Migration[ActiveRecord::Migration.current_version]
  def change
    create_table :charges do |t|
      t.string  :order_id, null: false
      t.integer :amount_cents, null: false
      t.timestamps
    end

    add_index :charges, :order_id
  end
end
