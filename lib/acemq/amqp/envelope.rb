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
      # message from a foreign publisher that set none carries. The same for
      # timestamp: without it, now; `timestamp: nil`, none (a consumed
      # message whose publisher set none reads nil, never 1970).
      def initialize(type: nil, id: GENERATE, origin: nil, timestamp: GENERATE, attempt: 1, headers: nil)
        @id = id.equal?(GENERATE) ? AMQP._new_id : Envelope.property(:id, id)
        # An empty id would travel as no message_id at all and arrive as nil:
        # say so here rather than let a key silently disappear.
        raise ConfigurationError, "id: must not be empty (leave it out for a new one, or nil for none)" if @id == ""

        @type = Envelope.property(:type, type)
        @origin = Envelope.property(:origin, origin)
        @timestamp = timestamp.equal?(GENERATE) ? Time.now.to_i : timestamp && Envelope.seconds(timestamp)
        @attempt = Envelope.positive_integer(:attempt, attempt)
        unless headers.nil? || headers.is_a?(Hash)
          raise ConfigurationError, "headers: must be a Hash of names to values, got #{headers.class}"
        end

        @headers = (headers || {}).transform_keys(&:to_s).freeze
        freeze
      end

      # A property as frozen UTF-8 text: AMQP's short strings travel as
      # UTF-8, so bytes that are not are refused here, saying so, rather
      # than as Ruby's ::EncodingError at the publish.
      def self.property(name, value)
        return nil if value.nil?

        Connection.text(name.to_s, value.to_s, why: "a message's #{name} travels as UTF-8").dup.freeze
      end

      # timestamp: as whole seconds since the epoch: a Time, an Integer, or
      # nil for now (Envelope.new itself takes nil as "none").
      def self.seconds(value)
        case value
        when nil then Time.now.to_i
        when Time then value.to_i
        when Integer
          return value if value.between?(0, 2**64 - 1)

          raise ConfigurationError, "timestamp: #{value} is outside 0..2**64-1 seconds since the epoch"
        else raise ConfigurationError, "timestamp: must be a Time or whole seconds since the epoch, got #{value.inspect}"
        end
      end

      def self.positive_integer(name, value)
        n = Integer(value)
        raise ConfigurationError, "#{name}: must be at least 1, got #{n}" if n < 1

        n
      rescue ArgumentError, TypeError
        raise ConfigurationError, "#{name}: must be a whole number, got #{value.inspect}"
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
