# frozen_string_literal: true

# The test kit, for RSpec with or without rspec-rails:
#
#   # spec/rails_helper.rb (or spec_helper.rb)
#   require "acemq/rspec"
#
# It includes AceMQ::RSpec::Helpers (acemq_message, deliver, acemq_broker,
# acemq_declare, acemq_publisher, eventually) and AceMQ::RSpec::Matchers
# (have_published) into every example group, and gives every example a
# memory:// broker of its own with AceMQ::Rails.publisher pointed at it, so
# what the code under test publishes is recorded and can be asserted on.
# Everything is put back after the example.
#
# `acemq: false` on a group or an example turns that off (an integration
# spec that publishes to a real RabbitMQ through AceMQ::Rails.publisher).
#
# Not loaded by `require "acemq"`: it configures RSpec, which an
# application's production code has no business doing. It requires no Rails
# and no rspec-rails: a plain RSpec suite uses it too.
require "rspec/core"
require "acemq"
require "acemq/rspec/helpers"
require "acemq/rspec/matchers"

module AceMQ
  # The test kit (see above). A suite that wants it in some example groups
  # only requires acemq/rspec/helpers and acemq/rspec/matchers and calls
  # AceMQ::RSpec::Harness.install_into(config, **filters) itself.
  #
  # Inside `module AceMQ`, `RSpec` is this module: the framework is ::RSpec.
  module RSpec
  end
end

::RSpec.configure { |config| AceMQ::RSpec::Harness.install_into(config) }
