# frozen_string_literal: true

require "rspec/expectations"
require "acemq/testing/helpers"
require "acemq/rspec/harness"

module AceMQ
  module RSpec
    # Included into example groups by `require "acemq/rspec"`: the kits'
    # shared helpers (acemq_message, deliver, acemq_broker, acemq_declare,
    # acemq_publisher, acemq_published, eventually; see
    # AceMQ::Testing::Helpers), failing with RSpec's failure.
    module Helpers
      include Testing::Helpers

      private

      def acemq_failure = ::RSpec::Expectations::ExpectationNotMetError
    end
  end
end
