# frozen_string_literal: true

module AceMQ
  module AMQP
    class Message
      # A consumed message: the engine's own delivery object, made by the
      # consumer (no allocator, so no `new`) and frozen, as one built by
      # hand is. It reads the delivery field by field, each the first time
      # it is asked for, and keeps what it read (in the delivery, `_read`):
      # the payload becomes Ruby objects on the first #payload (defined by
      # the engine), the envelope is built on the first #envelope, and #id,
      # #type, #attempt and #headers never build it. A handler pays for
      # what it reads. One object a delivery, not a Message wrapping it:
      # one allocation and one initialize fewer on every delivery's path.
      #
      # Loaded by acemq/amqp/message, after Message.
      class Consumed < Message
        def envelope
          lazily(:envelope) do
            Envelope.new(id: _id, type: _type, origin: _origin, timestamp: _timestamp, attempt: attempt, headers: headers)
          end
        end

        def delivery
          lazily(:delivery) do
            Delivery.new(queue: _queue, exchange: _exchange, routing_key: _routing_key,
                         redelivered: _redelivered?, properties: Properties.new(**_properties).freeze)
          end
        end

        def id = lazily(:id) { _id }
        def type = lazily(:type) { _type }
        def headers = lazily(:headers) { _headers.freeze }

        # The engine's delivery, for the subscription to settle: itself.
        def native_delivery = self

        private

        def lazily(name)
          read = _read
          read.fetch(name) { read[name] = yield }
        end
      end
    end
  end
end
