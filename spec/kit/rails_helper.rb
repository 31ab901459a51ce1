# frozen_string_literal: true

# The test kit under rspec-rails, as an application's spec/rails_helper.rb
# has it: a Rails application (a dozen lines, on an in-memory SQLite
# database), rspec-rails, then `require "acemq/rspec"`.
#
# Run in a process of its own — `rspec` in this directory, which is what
# spec/integration/rspec_kit_rails_spec.rb does — because rspec-rails loads
# Rails, and the suite's own process must stay without it. The suite's run
# skips these files (each returns unless rspec-rails is loaded).
ENV["RAILS_ENV"] ||= "test"
ENV["DATABASE_URL"] = "sqlite3::memory:"
$LOAD_PATH.unshift(File.expand_path("../../lib", __dir__))

require "logger"
require "rails"
require "active_record/railtie"
# What Bundler.require does with `gem "acemq"`: with Rails already loaded,
# this brings the Railtie too.
require "acemq"

module KitApp
  class Application < Rails::Application
    config.root = __dir__
    config.eager_load = false
    config.logger = Logger.new(nil)
    config.active_support.deprecation = :silence
    config.secret_key_base = "acemq-rspec-kit"
  end
end
Rails.application.initialize!

# The guide's migration, as a schema: `ActiveRecord::Migration[7.1]` is a
# Rails 7.1 class and this is Rails 6.1.
ActiveRecord::Schema.verbose = false
ActiveRecord::Schema.define do
  create_table :acemq_idempotency, id: false do |t|
    t.string   :message_id,  null: false, limit: 255, primary_key: true
    t.string   :state,       null: false, limit: 16
    t.string   :claimed_by,  limit: 64
    t.datetime :recorded_at, null: false
    t.datetime :expires_at,  null: false
  end
  add_index :acemq_idempotency, :expires_at, name: "acemq_idempotency_expiry"
end

require "rspec/rails"
require "rspec/rails/version"
require "acemq/rspec"

Dir[File.join(__dir__, "support", "**", "*.rb")].sort.each { |f| require f }

RSpec.configure do |config|
  config.expect_with(:rspec) { |c| c.syntax = :expect }
  config.mock_with(:rspec) { |m| m.verify_partial_doubles = true }
  config.use_transactional_fixtures = true
  config.order = :random
  Kernel.srand config.seed
end
