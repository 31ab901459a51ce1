# frozen_string_literal: true

# acemq/minitest in a plain Minitest suite: no Rails, no ActiveSupport, the
# kit included by hand, as a suite that is not a Rails application's has
# it. `rake minitest` runs this directory in a process of its own, and
# test/kit (the same kit under Rails) in another.
$LOAD_PATH.unshift(File.expand_path("../../lib", __dir__))

require "minitest/autorun"
require "securerandom"
require "acemq"
require "acemq/minitest"

# The handlers of deliver_test.rb raise on purpose, and the consumer logs each
# raise as a warning; the assertions are on the outcomes, not the log.
require "logger"
AceMQ::Rails.config.logger = Logger.new(nil)
