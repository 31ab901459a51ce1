# frozen_string_literal: true

# The guide's application, loaded by SeedApp.load! once ActiveRecord is:
# spec_helper requires every file under spec/support, and most runs have no
# ActiveRecord in them (nor should they: the gem must work without it).
return unless defined?(ActiveRecord::Base)

# app/models/application_record.rb, as Rails generates it.
class ApplicationRecord < ActiveRecord::Base
  self.abstract_class = true
end
