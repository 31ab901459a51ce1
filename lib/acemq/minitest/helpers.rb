# frozen_string_literal: true

require "minitest"
require "acemq/testing/helpers"
require "acemq/minitest/assertions"

module AceMQ
  module Minitest
    # The kit in a test class: the shared helpers (acemq_message, deliver,
    # acemq_broker, acemq_declare, acemq_publisher, acemq_published,
    # eventually), the assertions, and a memory:// broker of its own for
    # every test, with AceMQ::Rails.publisher pointed at it and put back
    # after. `require "acemq/minitest"` includes it into
    # ActiveSupport::TestCase; a plain Minitest::Test includes it itself:
    #
    #   class OrderPlacerTest < Minitest::Test
    #     include AceMQ::Minitest::Helpers
    #   end
    #
    # `acemq false` in a class turns the broker off for its tests (one that
    # must publish to a real RabbitMQ through AceMQ::Rails.publisher).
    module Helpers
      include Testing::Helpers
      include Assertions

      def self.included(base)
        super
        base.extend(ClassMethods)
        # Under ActiveSupport::TestCase the broker is a setup and a teardown
        # callback. Defined here, before any test class's own, so the
        # broker is up before their setup blocks publish, and comes down
        # after their teardown blocks have looked, but before the fixtures'
        # transaction rolls back: handlers still running on consumer
        # threads use that transaction's connection (Rails lends it to
        # every thread), and a rollback under them fails in ways that name
        # neither AceMQ nor the test.
        if base.respond_to?(:setup) && base.respond_to?(:set_callback)
          base.setup(:acemq_start)
          base.teardown(:acemq_stop)
        else
          base.include(Lifecycle)
        end
      end

      module ClassMethods
        # `acemq false`: no broker for this class's tests (nor its
        # subclasses'), and AceMQ::Rails.publisher left as it is.
        def acemq(enabled)
          @acemq = enabled ? true : false
        end

        # Whether this class's tests get a broker: the nearest `acemq` up
        # the class tree says, and yes when none does.
        def acemq?
          owner = ancestors.find { |c| c.instance_variable_defined?(:@acemq) }
          owner ? owner.instance_variable_get(:@acemq) : true
        end
      end

      # A plain Minitest::Test has no callbacks: Minitest's hooks for
      # libraries, outermost like RSpec's config hooks, so the test's own
      # setup already publishes to its broker and its teardown can still
      # look at what was published.
      module Lifecycle
        def before_setup
          acemq_start
          super
        end

        def after_teardown
          super
        ensure
          acemq_stop
        end
      end

      private

      def acemq_failure = ::Minitest::Assertion

      def acemq_start
        Testing::Harness.start(failure: ::Minitest::Assertion) if self.class.acemq?
      end

      def acemq_stop = Testing::Harness.stop
    end
  end
end
