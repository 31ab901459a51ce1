# frozen_string_literal: true

require "acemq/amqp"
require "acemq/testing/published"
require "acemq/testing/recording_batch"

module AceMQ
  module Testing
    # What AceMQ::Rails.publisher is during an test: the test's own
    # memory:// connection, with every publish recorded on the way through.
    #
    # The publish is the connection's: encoded (a payload that is not JSON
    # raises EncodingError, as it would in production), given its envelope,
    # and routed by the test's broker into whatever queue the test
    # declared for it, where a consumer started by `deliver` receives it.
    # One thing differs from RabbitMQ, on purpose: the test's broker
    # starts empty, while production's queues and exchanges are declared by
    # production's consumers, often in another application. So a publish
    # that nothing in the test would take (Unroutable, or NotFound for an
    # exchange nobody declared) is recorded as published and unrouted, and
    # returns its envelope, instead of raising.
    class RecordingPublisher
      # What the test's broker says about a publish it has nothing for.
      NOTHING_DECLARED = [AMQP::Unroutable, AMQP::NotFound].freeze

      # connection: a callable returning the connection, so a test that
      # never publishes never opens one.
      def initialize(connection)
        @connection = connection
        @lock = Mutex.new
        @records = []
      end

      def publish(payload, to:, exchange: "", envelope: nil, type: nil, headers: nil)
        env = connection.publish(payload, to: to, exchange: exchange, envelope: envelope, type: type, headers: headers)
        record(Published.new(sent: payload, to: to, exchange: exchange, envelope: env))
        env
      rescue *NOTHING_DECLARED
        # The envelope the publish would have had: the connection's own
        # making (the id, type and headers as given), with its origin.
        _, env = connection.__send__(:outgoing, payload, to, exchange, envelope, type, headers)
        env = env.with(origin: connection.origin) unless env.origin
        record(Published.new(sent: payload, to: to, exchange: exchange, envelope: env, routed: false))
        env
      rescue AMQP::Error => e
        record(Published.new(sent: payload, to: to, exchange: exchange, envelope: envelope, error: e))
        raise
      end

      # As Connection#batch: the block's publishes go out when it returns,
      # and the count comes back. Each is published as #publish does, so an
      # unrouted one is recorded, not raised; a payload that is not JSON
      # raises at b.publish, as the connection's own Batch does.
      def batch
        batch = RecordingBatch.new(connection)
        yield batch
        items = batch.take
        items.each { |payload, to, exchange, env| publish(payload, to: to, exchange: exchange, envelope: env) }
        items.size
      end

      # Every publish made, routed or not, oldest first (not the refused).
      def published = @lock.synchronize { @records.reject(&:refused?) }

      # Every publish refused (a payload that is not JSON), oldest first.
      def refused = @lock.synchronize { @records.select(&:refused?) }

      # Made and refused, in order, from the index-th on: what a block
      # matcher looks at.
      def since(index) = @lock.synchronize { @records.drop(index) }

      def size = @lock.synchronize { @records.size }

      def clear = @lock.synchronize { @records.clear }

      def connection = @connection.call

      # AceMQ::Rails.publisher replaces a publisher that says it is closed
      # with a connection to config.url, which in a spec would be a real
      # broker behind the test's back. So this one is closed only with
      # its test: the connection also carries the test's
      # subscriptions, and code under test closing "the publisher" must not
      # take them down.
      def closed? = false
      def close = nil

      def inspect = "#<AceMQ::Testing::RecordingPublisher published=#{published.size} refused=#{refused.size}>"

      def respond_to_missing?(name, include_private = false) = connection.respond_to?(name, include_private) || super

      def method_missing(name, ...)
        connection.respond_to?(name) ? connection.public_send(name, ...) : super
      end

      private

      def record(published)
        @lock.synchronize { @records << published }
      end
    end
  end
end
