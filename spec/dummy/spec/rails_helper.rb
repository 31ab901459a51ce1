# frozen_string_literal: true

# The application's specs, as a Rails application with rspec-rails has them.
# `--require rails_helper` (.rspec) loads this first, so an example file needs
# no require line: the guide's PaymentsConsumer example runs as printed.
ENV["RAILS_ENV"] ||= "test"
require_relative "../config/environment"
abort("the specs are running in #{Rails.env}") unless Rails.env.test?
require "rspec/rails"

# The test database is the migrations' (there is no schema.rb to load: the
# app never dumps one), so bring it up to date once per run. Rails 7.2 moved
# migration_context to the pool (where the connection's is deprecated);
# Rails 6.1's pool has none.
ActiveRecord::Migration.verbose = false
pool = ActiveRecord::Base.connection_pool
(pool.respond_to?(:migration_context) ? pool : ActiveRecord::Base.connection).migration_context.migrate

RSpec.configure do |config|
  config.expect_with(:rspec) { |c| c.syntax = :expect }
  config.mock_with(:rspec) { |m| m.verify_partial_doubles = true }
  config.use_transactional_fixtures = true
  config.filter_rails_from_backtrace!
  config.order = :random
  Kernel.srand config.seed

  # The payment gateway is a spy in every example, as a real application's
  # would be (nobody's card is charged by a spec); it still records the
  # charge, so an example can count rows too. The guide's PaymentsConsumer
  # example asserts `expect(Payments).to have_received(:charge!)`, which
  # needs Payments to be a spy: this is where it becomes one.
  config.before { allow(Payments).to receive(:charge!).and_call_original }
end
