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

# The guide's migration, from the one copy of it (spec/dummy), at this
# Rails' version: `ActiveRecord::Migration[7.1]` is refused by Rails 6.1.
ActiveRecord::Migration.verbose = false
require File.expand_path("../dummy/db/migrate/20260926000100_create_acemq_idempotency", __dir__)
CreateAcemqIdempotency.new.migrate(:up)

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
