# frozen_string_literal: true

require "securerandom"
require "acemq/amqp"
require "acemq/testing/failure"
require "acemq/amqp/patterns"
require "acemq/rails"
require "acemq/testing/consumer_run"
require "acemq/testing/recording_publisher"

module AceMQ
  module Testing
    # One test's AceMQ: a memory:// broker no other test sees, the
    # recording publisher installed as AceMQ::Rails.publisher, and the
    # consumer classes `deliver` has started on it. Opened when first used,
    # so a test that never touches AceMQ costs nothing; reset and closed
    # when the test ends.
    #
    # The mechanism of both test kits: acemq/rspec starts one around every
    # example, acemq/minitest around every test. Neither framework appears
    # here; each kit says which exception is its failed assertion (failure:),
    # so that a message that never settles fails the test rather than
    # erroring it.
    class Harness
      # How long the test's end waits for a handler still running.
      STOP_TIMEOUT = 5

      @current = nil

      class << self
        # The running test's harness, nil outside a test or where the kit is
        # turned off. One at a time: tests run in parallel threads would
        # share it, so parallel tests want processes (each has its own).
        attr_reader :current

        def start(failure: Failure)
          stop
          @current = new(failure: failure)
          @current.install
          @current
        end

        def stop
          harness = @current
          @current = nil
          harness&.finish
        end

        # The current harness, or an error saying why there is none.
        def current!
          @current || raise(AMQP::ConfigurationError,
                            "AceMQ's test kit has no broker here: the kit is turned off for this test " \
                            "(`acemq: false` in RSpec, `acemq false` in a Minitest class), or this runs outside " \
                            "a test (RSpec's before(:all) or before(:suite), a Minitest class body)")
        end
      end

      attr_reader :url, :publisher, :failure

      # failure: the exception class a test framework reports as a failed
      # assertion (RSpec's ExpectationNotMetError, Minitest::Assertion).
      def initialize(failure: Failure)
        @failure = failure
        @url = "memory://acemq-test-#{Process.pid}-#{SecureRandom.hex(6)}"
        @lock = Mutex.new
        @connection = nil
        @runs = {}
        @duplicates = []
        @listener = nil
        @publisher = RecordingPublisher.new(-> { connection })
      end

      # Point AceMQ::Rails.publisher at this test's broker. What it was
      # is read without calling the reader, which would open a connection
      # to config.url when there was none.
      def install
        @previous_publisher = AceMQ::Rails.current_publisher
        AceMQ::Rails.publisher = @publisher
      end

      # The test's broker: a connection to it, opened on first use, named
      # as AceMQ::Rails.publisher names its own (it is the publisher here).
      def connection
        @lock.synchronize do
          @connection ||= AMQP::Connection.open(@url, origin: "#{AceMQ::Rails.config.origin}:publish")
        end
      end

      # consumer running on this broker, started on first use. instance:
      # is the object whose #call handles the messages (default: a new one).
      def run_for(consumer, instance: nil)
        unless consumer.respond_to?(:subscribe) && consumer.respond_to?(:topology)
          raise AMQP::ConfigurationError,
                "deliver needs a consumer class (an AceMQ::Rails::Consumer subclass), got #{consumer.inspect}"
        end

        run = @lock.synchronize { @runs[consumer] }
        if run
          if instance && !instance.equal?(run.instance)
            raise AMQP::ConfigurationError,
                  "#{consumer} already runs on #{run.instance.inspect} in this test: " \
                  "pass instance: on the first deliver"
          end
          return run
        end

        listen
        run = ConsumerRun.new(self, consumer, instance || consumer.new)
        @lock.synchronize { @runs[consumer] = run }
      end

      # Declare on this test's broker what production declares elsewhere:
      # a consumer class's topology (its queue, .dlq, exchanges and
      # bindings) or an AceMQ::AMQP::Topology.
      def declare(*things)
        things.flatten.each do |thing|
          if thing.respond_to?(:apply)
            thing.apply(connection)
          elsif thing.respond_to?(:topology)
            thing.topology.apply(connection)
          else
            raise AMQP::ConfigurationError,
                  "declare takes consumer classes and AceMQ::AMQP::Topology objects, got #{thing.inspect}"
          end
        end
        self
      end

      # [queue, message id] of every message the idempotency guard accepted
      # as a duplicate during the test, in order.
      def duplicates = @lock.synchronize { @duplicates.dup }

      def finish
        deadline = Time.now + STOP_TIMEOUT
        @lock.synchronize { @runs.values }.each { |run| run.stop(deadline) }
        AMQP::Patterns.off(@listener) if @listener
        if @connection
          # The broker outlives its connections (it is the process's, by
          # name); emptied, it holds nothing of the test.
          @connection.reset_memory
          @connection.close
        end
        AceMQ::Rails.publisher = @previous_publisher
        nil
      end

      def inspect = "#<AceMQ::Testing::Harness #{@url} consumers=#{@runs.keys.map(&:to_s)}>"

      private

      # The guard's :duplicate event is how a duplicate is told from a first
      # delivery: both are accepted, and only the guard knows which it was.
      def listen
        return if @listener

        @listener = AMQP::Patterns.on(:duplicate) do |_, detail|
          message = detail[:message]
          entry = [message&.delivery&.queue, message&.envelope&.id]
          @lock.synchronize { @duplicates << entry }
        end
      end
    end
  end
end
