# frozen_string_literal: true

# One call to Payments.charge!. Deliberately without a unique index on
# order_id: the guard, not the schema, is what keeps a duplicate from
# charging twice here.
class Charge < ApplicationRecord
end
