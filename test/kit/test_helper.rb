# frozen_string_literal: true

# acemq/minitest in a Rails application's own suite, as test/test_helper.rb
# has it: the application (a dozen lines, on an in-memory SQLite database),
# rails/test_help, then `require "acemq/minitest"`, which includes the kit
# into ActiveSupport::TestCase. The same guide application as spec/kit's
# (spec/dummy's model, store and consumer, loaded from there).
#
# `rake minitest` runs this directory in a process of its own, because it
# loads Rails, and test/plain (no Rails at all) in another.
ENV["RAILS_ENV"] ||= "test"
ENV["DATABASE_URL"] = "sqlite3::memory:"
$LOAD_PATH.unshift(File.expand_path("../../lib", __dir__))

require "logger"
require "rails"
require "active_record/railtie"
require "acemq"

module MinitestKitApp
  class Application < Rails::Application
    config.root = __dir__
    config.eager_load = false
    config.logger = Logger.new(nil)
    config.active_support.deprecation = :silence
    config.secret_key_base = "acemq-minitest-kit"
  end
end
Rails.application.initialize!

require "rails/test_help"
require "acemq/minitest"

# The guide's migration, from the one copy of it (spec/dummy), migrated
# after rails/test_help, which would otherwise see a schema it has no file
# for and purge it.
ActiveRecord::Migration.verbose = false
require File.expand_path("../../spec/dummy/db/migrate/20260926000100_create_acemq_idempotency", __dir__)
CreateAcemqIdempotency.new.migrate(:up)

# Payments, HandledMessage, ActiveRecordIdempotencyStore, PaymentsConsumer.
require File.expand_path("../../spec/kit/support/payments", __dir__)

# What the RSpec kit's examples get from rspec-mocks, for these tests:
# Minitest 6 no longer ships minitest/mock, and the two things needed are
# a few lines each.
module KitTestDoubles
  # Payments.charge! recording its calls (on whichever thread the handler
  # runs) instead of charging, or raising raising:; put back after the test.
  def record_charges(raising: nil)
    calls = Queue.new
    original = Payments.method(:charge!)
    Payments.define_singleton_method(:charge!) do |*args|
      calls << args
      raise raising if raising
    end
    @kit_restore << -> { Payments.define_singleton_method(:charge!, original) }
    calls
  end

  # owner::name is value for this test: rspec-mocks' stub_const.
  def stub_const(owner, name, value)
    original = owner.const_get(name, false)
    swap = lambda do |v|
      owner.send(:remove_const, name)
      owner.const_set(name, v)
    end
    swap.call(value)
    @kit_restore << -> { swap.call(original) }
  end

  def self.included(base)
    base.setup { @kit_restore = [] }
    base.teardown { @kit_restore.reverse_each(&:call) }
  end
end

ActiveSupport::TestCase.include(KitTestDoubles)
