# frozen_string_literal: true

# The test kit for Minitest, and so for a Rails application's default
# suite:
#
#   # test/test_helper.rb, after require "rails/test_help"
#   require "acemq/minitest"
#
# Includes AceMQ::Minitest::Helpers into ActiveSupport::TestCase when it is
# there (deliver, acemq_message, acemq_broker, acemq_declare,
# acemq_publisher, acemq_published, eventually; assert_published,
# refute_published, assert_accepted, assert_duplicate, assert_retried,
# assert_dead_lettered, assert_waiting), and every test of it gets a
# memory:// broker of its own with AceMQ::Rails.publisher pointed at it.
# A plain Minitest::Test includes AceMQ::Minitest::Helpers itself.
#
# The mechanism is the RSpec kit's (AceMQ::Testing): the same broker per
# test, the same recording publisher, the same deliver, and the same
# failure messages. Not loaded by `require "acemq"`; it loads no Rails.
require "minitest"
require "acemq"
require "acemq/minitest/helpers"

module AceMQ
  # The test kit (see above). Inside `module AceMQ`, `Minitest` is this
  # module: the framework is ::Minitest.
  module Minitest
  end
end

# The hook runs at once when ActiveSupport::TestCase is already loaded (the
# usual order: rails/test_help first), or when it loads.
if defined?(ActiveSupport.on_load)
  ActiveSupport.on_load(:active_support_test_case) { include AceMQ::Minitest::Helpers }
end
