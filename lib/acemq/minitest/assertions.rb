# frozen_string_literal: true

require "minitest"
require "acemq/testing/publish_expectation"

module AceMQ
  module Minitest
    # The assertions of acemq/minitest: what RSpec's have_published and the
    # Outcome predicates say, in Minitest's form. They fail with the same
    # messages as the RSpec kit (the same PublishExpectation writes them).
    module Assertions
      NOT_GIVEN = Testing::PublishExpectation::ANY
      private_constant :NOT_GIVEN

      # What the code published through AceMQ::Rails.publisher:
      #
      #   assert_published({ "order_id" => "A-1" }, on: "orders-events", to: "order.placed") do
      #     OrderPlacer.place("A-1")
      #   end
      #
      # With a block, what the block published; without, everything this
      # test has published so far. payload: a value, or anything with ===
      # (a Regexp, a Class, a lambda for a partial match), held against the
      # payload as the code gave it or as a consumer will receive it, so
      # `{ order_id: "A-1" }` and `{ "order_id" => "A-1" }` both match.
      # to: the queue (through the default exchange) or, with on:, the
      # routing key. type:, headers: (among the message's others).
      #
      # Exactly once unless a count says otherwise: times: n (or :once,
      # :twice, :thrice), at_least: n, at_most: n. A publish made twice is
      # the double charge this library exists to prevent. Returns the
      # matching publishes (AceMQ::Testing::Published each).
      def assert_published(payload = NOT_GIVEN, to: NOT_GIVEN, on: nil, type: NOT_GIVEN, headers: nil, times: nil,
                           at_least: nil, at_most: nil, message: nil, &block)
        expectation = acemq_publish_expectation(payload, to, on, type, headers)
        counts = { exactly: times, at_least: at_least, at_most: at_most }.compact
        if counts.size > 1
          raise AMQP::ConfigurationError,
                "assert_published takes one count, got #{counts.keys.map { |k| "#{k}:" }.join(' and ')}"
        end
        counts.each { |kind, n| expectation.public_send(kind, n) }

        matched = expectation.matches?(block || acemq_publisher)
        assert(matched, acemq_message_with(message) { expectation.failure_message })
        expectation.matching
      end

      # Nothing matching was published (by the block, or in this test so
      # far). The same filters as assert_published, and no count: "not
      # twice" is better said as assert_published(..., times: n).
      def refute_published(payload = NOT_GIVEN, to: NOT_GIVEN, on: nil, type: NOT_GIVEN, headers: nil, message: nil,
                           &block)
        expectation = acemq_publish_expectation(payload, to, on, type, headers)
        nothing = expectation.does_not_match?(block || acemq_publisher)
        refute(!nothing, acemq_message_with(message) { expectation.failure_message_when_negated })
        nil
      end

      # What happened to a message deliver ran, asserted with the Outcome as
      # the failure message (`#<... message "m-1": retried after attempt 1,
      # waiting in rung 1: "gateway down">`). Each returns the outcome.
      %i[accepted duplicate retried dead_lettered waiting].each do |kind|
        define_method(:"assert_#{kind}") do |outcome, message = nil|
          unless outcome.respond_to?(:"#{kind}?")
            raise AMQP::ConfigurationError, "assert_#{kind} takes what deliver returned, got #{outcome.inspect}"
          end

          assert(outcome.public_send(:"#{kind}?"),
                 acemq_message_with(message) { "expected #{outcome.inspect} to be #{kind.to_s.tr('_', ' ')}" })
          outcome
        end
      end

      private

      def acemq_publish_expectation(payload, to, on, type, headers)
        expectation = Testing::PublishExpectation.new(payload)
        expectation.to(to) unless to.equal?(NOT_GIVEN)
        expectation.on(on) if on
        expectation.with_type(type) unless type.equal?(NOT_GIVEN)
        expectation.with_headers(headers) if headers
        expectation
      end

      # Minitest's own way with a custom message: it goes first, then ours.
      def acemq_message_with(custom, &ours)
        return ours unless custom

        -> { "#{custom.is_a?(Proc) ? custom.call : custom}.\n#{ours.call}" }
      end
    end
  end
end
