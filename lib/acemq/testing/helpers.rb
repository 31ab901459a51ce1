# frozen_string_literal: true

require "json"
require "acemq/amqp"
require "acemq/testing/failure"
require "acemq/testing/harness"
require "acemq/testing/published"

module AceMQ
  module Testing
    # The helpers both test kits give a test: AceMQ::RSpec::Helpers and
    # AceMQ::Minitest::Helpers are this module and the one method that
    # differs, acemq_failure (the framework's failed assertion).
    module Helpers
      NEW_ID = Object.new.freeze
      private_constant :NEW_ID

      # A message as a handler receives it, for calling #call directly:
      #
      #   consumer.call(acemq_message({ "order_id" => "A-1" }, id: "m-1", type: "payment.due.v1"))
      #
      # The payload goes through JSON, as it would on the wire, so symbol keys
      # arrive as strings and a payload that is not JSON raises EncodingError
      # here rather than in production. Without id: a fresh UUIDv7, as a
      # publisher makes; `id: nil` is a foreign publisher's message without
      # one. message.delivery is filled in (queue:, exchange:, routing_key:,
      # redelivered:) for handlers that read it.
      def acemq_message(payload = {}, id: NEW_ID, type: nil, attempt: 1, headers: {}, origin: nil, timestamp: nil,
                        queue: nil, exchange: "", routing_key: nil, redelivered: false)
        fields = { type: type, attempt: attempt, headers: headers, origin: origin }
        fields[:id] = id unless id.equal?(NEW_ID)
        fields[:timestamp] = timestamp if timestamp
        AMQP::Message.new(
          payload: acemq_json_copy(payload),
          envelope: AMQP::Envelope.new(**fields),
          delivery: AMQP::Delivery.new(queue: queue, exchange: exchange.to_s, routing_key: routing_key || queue,
                                       redelivered: redelivered)
        )
      end

      # Run one message through consumer's whole pipeline on this test's
      # broker — its topology, its idempotency macro, its retry ladder, the
      # class's own subscribe — and return the Outcome once it settled:
      #
      #   outcome = deliver(PaymentsConsumer, { "order_id" => "A-1" })
      #   expect(outcome).to be_retried             # assert_retried outcome
      #   expect(outcome.next_attempt).to be_accepted
      #
      # message: a payload (with id:, type:, headers: for its envelope), an
      # AceMQ::AMQP::Message, or a Published (acemq_published.last). It is
      # sent to the class's queue; through an exchange instead when
      # exchange: (with routing_key:) is given or the message arrived by one
      # (a Published on an exchange, acemq_message(exchange:)), so that the
      # class's bindings decide, and Unroutable says they would not take it.
      #
      # The first deliver of a class in a test starts it on instance:
      # (default: a new one), kept for the test as the runner keeps one
      # for the process; later ones reuse it.
      #
      # The handler runs on the consumer's own thread, as in production. A
      # message always starts at attempt 1: the broker counts attempts, not
      # the message.
      def deliver(consumer, message = {}, id: NEW_ID, type: nil, headers: nil, exchange: nil, routing_key: nil,
                  instance: nil, timeout: ConsumerRun::TIMEOUT)
        run = Harness.current!.run_for(consumer, instance: instance)
        message = message.message if message.is_a?(Published)
        if message.is_a?(AMQP::Message)
          changes = { type: type, headers: headers }.compact
          changes[:id] = id unless id.equal?(NEW_ID)
          message = AMQP::Message.new(payload: message.payload, envelope: message.envelope.with(**changes),
                                      delivery: message.delivery)
        else
          message = acemq_message(message, id: id, type: type, headers: headers || {}, queue: run.queue)
        end
        if exchange.nil? && message.delivery && !message.delivery.exchange.to_s.empty?
          exchange = message.delivery.exchange
          routing_key ||= message.delivery.routing_key
        end
        run.deliver(message, exchange: exchange, routing_key: routing_key, timeout: timeout)
      end

      # This test's memory:// broker (a Connection): advance_clock,
      # queue_depth, peek_dead_letters, publish, consume.
      def acemq_broker = Harness.current!.connection

      # Declare consumer classes' topology (or AceMQ::AMQP::Topology objects)
      # on this test's broker, which starts empty: what code under test
      # publishes to has to exist, as it has to on RabbitMQ.
      def acemq_declare(*consumers_or_topologies) = Harness.current!.declare(*consumers_or_topologies)

      # AceMQ::Rails.publisher during this test, recording.
      def acemq_publisher = Harness.current!.publisher

      # What was published through it so far (AceMQ::Testing::Published each).
      def acemq_published = acemq_publisher.published

      # Poll until the block returns something truthy and return it; fail
      # the test after timeout seconds. For what happens on other threads
      # (a consumer started with acemq_broker.consume, a real RabbitMQ): a
      # deadline, never a guessed sleep.
      def eventually(timeout: 5, interval: 0.02)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        loop do
          value = yield
          return value if value

          if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
            raise acemq_failure, "condition not met within #{timeout}s (last: #{value.inspect})"
          end

          sleep interval
        end
      end

      private

      # The exception the framework reports as a failed assertion.
      def acemq_failure = Failure

      def acemq_json_copy(payload)
        JSON.parse(JSON.generate(payload))
      rescue JSON::GeneratorError, TypeError, ArgumentError => e
        raise AMQP::EncodingError, "the payload cannot be sent as JSON (#{e.message}): publish a Hash, Array, " \
                                   "String, number, true, false or nil"
      end
    end
  end
end
