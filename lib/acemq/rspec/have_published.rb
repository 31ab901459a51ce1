# frozen_string_literal: true

require "rspec/expectations"
require "acemq/testing/publish_expectation"

module AceMQ
  module RSpec
    # The have_published matcher (see Matchers#have_published): the kits'
    # shared PublishExpectation with RSpec's matcher protocol. Composable
    # brings RSpec's own values_match? and description_of, so hash_including
    # and friends work inside payloads and headers, and describe themselves.
    class HavePublished < Testing::PublishExpectation
      include ::RSpec::Matchers::Composable

      def supports_block_expectations? = true
      def supports_value_expectations? = true

      private

      def ambiguous_negation
        "not_to have_published(...).#{@count.first}(#{@count.last}) is ambiguous: " \
          "say to have_published(...).exactly(0).times, or leave the count out"
      end
    end
  end
end
