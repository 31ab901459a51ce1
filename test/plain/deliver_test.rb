# frozen_string_literal: true

require_relative "test_helper"

module PlainGateway
  class Down < StandardError; end

  # What the handlers were asked to charge, across the consumer's threads.
  CHARGED = Queue.new
  @down = false

  class << self
    attr_accessor :down

    def charge!(order_id)
      raise Down, "gateway down" if down

      CHARGED << order_id
    end
  end
end

class PlainPaymentsConsumer < AceMQ::Rails::Consumer
  queue "plain.payments"
  retries max_attempts: 3, initial_delay: 1, max_delay: 60
  idempotent store: AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new

  def call(message)
    PlainGateway.charge!(message.payload["order_id"])
    accept
  end
end

# A handler that holds its message until told to let go.
class StuckConsumer < AceMQ::Rails::Consumer
  queue "plain.stuck"
  RELEASE = Queue.new

  def call(_message)
    RELEASE.pop
    accept
  end
end

class DeliverTest < Minitest::Test
  include AceMQ::Minitest::Helpers

  def setup
    PlainGateway.down = false
    PlainGateway::CHARGED.clear
  end

  def test_runs_the_whole_pipeline_and_charges_once_for_three_deliveries
    outcomes = Array.new(3) { deliver(PlainPaymentsConsumer, { "order_id" => "A-1" }, id: "m-1") }

    assert_equal %i[accepted duplicate duplicate], outcomes.map(&:kind)
    outcomes.each { |o| assert_accepted(o) }
    assert_duplicate outcomes.last
    assert_equal 1, PlainGateway::CHARGED.size
  end

  def test_walks_a_gateway_outage_up_the_ladder_to_the_dlq
    PlainGateway.down = true

    first = assert_retried(deliver(PlainPaymentsConsumer, { "order_id" => "A-2" }, id: "m-2"))
    assert_equal 1, first.rung
    last = assert_dead_lettered(first.last_attempt)
    assert_equal "retries exhausted after 3 attempts: PlainGateway::Down: gateway down", last.reason
    assert_equal %i[retried retried dead_lettered], last.history.map(&:kind)
    assert_equal({ ready: 1, unacked: 0 }, acemq_broker.queue_depth("plain.payments.dlq"))
  end

  def test_an_outcome_assertion_fails_with_the_outcome
    PlainGateway.down = true
    outcome = deliver(PlainPaymentsConsumer, { "order_id" => "A-3" }, id: "m-3")

    error = assert_raises(Minitest::Assertion) { assert_accepted(outcome) }
    assert_equal 'expected #<AceMQ::Testing::Outcome PlainPaymentsConsumer message "m-3": retried after attempt 1, ' \
                 'waiting in rung 1: "PlainGateway::Down: gateway down"> to be accepted', error.message
  end

  def test_eventually_fails_the_test_with_the_last_value
    error = assert_raises(Minitest::Assertion) { eventually(timeout: 0.05) { nil } }
    assert_equal "condition not met within 0.05s (last: nil)", error.message
  end
end

# The kit's lifecycle, driven from a class that has it turned off: a test
# class run from here gets its own broker and gives the publisher back.
class LifecycleTest < Minitest::Test
  include AceMQ::Minitest::Helpers
  acemq false

  # A test class run by hand, outside Minitest's own run, with its result.
  def run_test(&body)
    klass = Class.new(Minitest::Test) do
      include AceMQ::Minitest::Helpers
      define_method(:test_it, &body)
    end
    klass.new(:test_it).run
  end

  def test_gives_every_test_a_broker_and_puts_the_publisher_back
    AceMQ::Rails.publisher = mine = Object.new
    seen = []

    result = run_test do
      seen << AceMQ::Rails.publisher << acemq_broker
      AceMQ::Rails.publisher.publish({ "n" => 1 }, to: "q")
      assert_published(to: "q")
    end

    assert_predicate result, :passed?, result.failures.map(&:message).join
    assert_instance_of AceMQ::Testing::RecordingPublisher, seen[0]
    assert_match(%r{\Amemory://acemq-test-}, seen[1].url) if seen[1].respond_to?(:url)
    assert_same mine, AceMQ::Rails.current_publisher
    assert_nil AceMQ::Testing::Harness.current
  ensure
    AceMQ::Rails.publisher = nil
  end

  def test_a_message_that_never_settles_is_a_failure_not_an_error
    result = run_test do
      deliver(StuckConsumer, {}, timeout: 0.2)
    ensure
      StuckConsumer::RELEASE << true # or the test's end waits for the handler
    end

    failure = result.failures.first
    assert_kind_of Minitest::Assertion, failure
    refute_kind_of Minitest::UnexpectedError, failure
    assert_match(/StuckConsumer did not settle message .* within 0.2s \(plain.stuck: \{ready: 0, unacked: 1\}|StuckConsumer did not settle message .* within 0.2s \(plain.stuck: \{:ready=>0, :unacked=>1\}/,
                 failure.message)
  end

  def test_acemq_false_has_no_broker_and_says_so
    assert_nil AceMQ::Testing::Harness.current
    error = assert_raises(AceMQ::AMQP::ConfigurationError) { acemq_broker }
    assert_match(/`acemq false` in a Minitest class/, error.message)
  end
end
