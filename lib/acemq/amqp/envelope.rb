# frozen_string_literal: true

module AceMQ
  module AMQP
    # Identity and metadata of a message. The id is a UUIDv7 unless given, and
    # it is carried unchanged through every retry, rung and the DLQ, which is
    # what makes it the default idempotency key.
    #
    # Publishing the same Envelope twice publishes the same message id twice:
    # that is what a redelivery looks like from inside a handler.
    class Envelope
      attr_reader :id, :type, :origin, :timestamp, :attempt, :headers

      GENERATE = Object.new.freeze
      private_constant :GENERATE

      # Without id: a new UUIDv7. With `id: nil`, no id at all: what a
      # message from a foreign publisher that set none carries.
      def initialize(type: nil, id: GENERATE, origin: nil, timestamp: nil, attempt: 1, headers: nil)
        @id = id.equal?(GENERATE) ? AMQP._new_id : id&.to_s&.dup&.freeze
        @type = type&.to_s&.dup&.freeze
        @origin = origin&.to_s&.dup&.freeze
        @timestamp = timestamp || Time.now.to_i
        @attempt = Integer(attempt)
        @headers = (headers || {}).transform_keys(&:to_s).freeze
        freeze
      end

      # A copy with some fields replaced.
      def with(**changes)
        self.class.new(type: type, id: id, origin: origin, timestamp: timestamp, attempt: attempt, headers: headers,
                       **changes)
      end

      def ==(other)
        other.is_a?(Envelope) && other.id == id && other.type == type && other.origin == origin &&
          other.timestamp == timestamp && other.attempt == attempt && other.headers == headers
      end
      alias eql? ==

      def hash = [id, type, origin, timestamp, attempt].hash

      def to_h
        { id: id, type: type, origin: origin, timestamp: timestamp, attempt: attempt, headers: headers }
      end

      def inspect
        "#<AceMQ::AMQP::Envelope id=#{id.inspect} type=#{type.inspect} attempt=#{attempt}>"
      end
    end
  end
end
