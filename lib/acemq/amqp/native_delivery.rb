# frozen_string_literal: true

module AceMQ
  module AMQP
    class Message
      # NativeDelivery is Message::Consumed's old name (the engine sets the
      # constant to the class): its own readers, from before the delivery
      # was the message. Deprecated: each warns once, naming the reader to
      # use.
      #
      # Loaded by acemq/amqp/message, after Consumed.
      class Consumed
        READERS = { origin: [:_origin, "envelope.origin"], timestamp: [:_timestamp, "envelope.timestamp"],
                    properties: [:_properties, "delivery.properties"], queue: [:_queue, "delivery.queue"],
                    exchange: [:_exchange, "delivery.exchange"], routing_key: [:_routing_key, "delivery.routing_key"],
                    redelivered?: [:_redelivered?, "delivery.redelivered?"] }.freeze
        private_constant :READERS
        @warned = {}
        READERS.each do |name, (reader, instead)|
          define_method(name) do
            Consumed.deprecated(name, instead)
            __send__(reader)
          end
        end

        def self.deprecated(name, instead)
          return if @warned[name]

          @warned[name] = true
          warn("acemq: NativeDelivery##{name} is deprecated and will be removed: the delivery is the message now, " \
               "read message.#{instead}", uplevel: 2)
        end
      end
    end
  end
end
