# frozen_string_literal: true

require_relative "test_helper"

# Application code that publishes through AceMQ::Rails.publisher, as a
# controller or a model callback would.
module PlainOrderPlacer
  def self.place(order_id = "A-1")
    AceMQ::Rails.publisher.publish({ order_id: order_id, amount_cents: 1299 }, exchange: "orders-events",
                                                                               to: "order.placed",
                                                                               type: "order.placed.v1",
                                                                               headers: { "trace" => "t-1" })
  end
end

class PublishingTest < Minitest::Test
  include AceMQ::Minitest::Helpers

  def place(order_id = "A-1") = PlainOrderPlacer.place(order_id)

  # The message of the assertion failure the block ends in.
  def failure_of(&block)
    assert_raises(Minitest::Assertion, &block).message
  end

  def test_asserts_what_the_block_published_and_returns_it
    matched = assert_published({ order_id: "A-1", amount_cents: 1299 }, on: "orders-events", to: "order.placed",
                                                                        type: "order.placed.v1") { place }

    assert_equal 1, matched.size
    assert_equal({ "order_id" => "A-1", "amount_cents" => 1299 }, matched.first.payload)
    assert_published(headers: { trace: "t-1" }) { place }
    assert_published(->(p) { p["order_id"].start_with?("A-") }) { place }
  end

  def test_counts_exactly_once_unless_told
    assert_published(times: 2) { 2.times { place } }
    assert_published(at_least: 2) { 3.times { place } }
    assert_published(at_most: 1) { nil }
    assert_published(times: 0, to: "elsewhere") { place }
    refute_published { nil }
    refute_published(to: "order.placed") { place } # order.placed is a routing key here, not a queue

    # Without a block: everything this test published.
    assert_published({ "order_id" => "A-1", "amount_cents" => 1299 }, times: 7)
  end

  def test_fails_with_what_was_published_instead
    message = failure_of { assert_published({ "order_id" => "A-1" }, on: "orders-events") { place("A-2") } }

    # Hashes as this Ruby inspects them: the RSpec kit's message, word for word.
    assert_equal <<~TEXT.chomp, message
      expected the block to publish once on "orders-events" with payload #{{ 'order_id' => 'A-1' }.inspect}, but it published it 0 times.
      Published (1):
        on "orders-events" to "order.placed" type="order.placed.v1" payload=#{{ 'order_id' => 'A-2', 'amount_cents' => 1299 }.inspect} headers=#{{ 'trace' => 't-1' }.inspect} (unrouted: nothing in this test takes it)
    TEXT
  end

  def test_fails_on_the_wrong_queue_type_count_or_headers_and_says_when_nothing_was_published
    assert_equal <<~TEXT.chomp, failure_of { assert_published(to: "order.placed") { place } }.lines.first(2).join.chomp
      expected the block to publish once to "order.placed", but it published it 0 times.
      Published (1):
    TEXT
    assert_match(/\Aexpected the block to publish once anything with type "order.paid.v1"/,
                 failure_of { assert_published(type: "order.paid.v1") { place } })
    assert_match(/\Aexpected the block to publish once anything, but it published it twice\./,
                 failure_of { assert_published { 2.times { place } } })
    assert_match(/with headers #{Regexp.escape({ 'trace' => 't-2' }.inspect)}, but it published it 0 times/,
                 failure_of { assert_published(headers: { "trace" => "t-2" }) { place } })
    assert_match(/with payload matching the lambda at #{Regexp.escape(__FILE__)}:\d+, but it published it 0 times/,
                 failure_of { assert_published(->(p) { p["order_id"] == "B-1" }) { place } })
    assert_equal "expected the block to publish once anything, but it published it 0 times.\nNothing was published.",
                 failure_of { assert_published { nil } }
    assert_match(/\AOrder placing is broken\.\nexpected the block to publish once/,
                 failure_of { assert_published(message: "Order placing is broken") { nil } })
  end

  def test_refute_fails_with_what_was_published
    message = failure_of { refute_published(on: "orders-events") { place } }

    assert_match(/\Aexpected the block not to publish on "orders-events", but it published it once\.\nPublished \(1\):/,
                 message)
  end

  def test_lists_a_publish_refused_as_not_json_and_does_not_count_it
    assert_raises(AceMQ::AMQP::EncodingError) { AceMQ::Rails.publisher.publish({ "x" => Float::NAN }, to: "q") }

    assert_match(/Nothing was published\.\nRefused, so not published \(1\):\n  to "q" payload=.*refused: AceMQ::AMQP::EncodingError/,
                 failure_of { assert_published(to: "q") })
  end

  def test_refuses_what_it_cannot_mean_with_an_error_of_its_own
    error = assert_raises(AceMQ::AMQP::ConfigurationError) { assert_published(times: 1, at_least: 1) { place } }
    assert_equal "assert_published takes one count, got exactly: and at_least:", error.message
    assert_raises(AceMQ::AMQP::ConfigurationError) { assert_published(times: -1) { nil } }
    error = assert_raises(AceMQ::AMQP::ConfigurationError) { assert_accepted(:accepted) }
    assert_match(/assert_accepted takes what deliver returned, got :accepted/, error.message)
  end

  def test_lands_in_the_queues_the_test_declares_as_in_production
    acemq_declare(AceMQ::AMQP::Topology.new.exchange("orders-events", type: :topic).queue("shop.audit")
                                       .bind("shop.audit", to: "orders-events", routing_key: "order.*"))

    place

    assert_predicate acemq_published.last, :routed?
    assert_equal({ ready: 1, unacked: 0 }, acemq_broker.queue_depth("shop.audit"))
  end
end
