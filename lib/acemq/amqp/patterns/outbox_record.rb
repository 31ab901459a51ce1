# frozen_string_literal: true

module AceMQ
  module AMQP
    module Patterns
      # Build a message for the outbox, to be written with
      # SQLOutboxStore#add in the same transaction as the work it describes:
      #
      #   store.add(Patterns.record(mq, event, to: "order.placed", exchange: "orders-events",
      #                             type: "order.placed.v2"),
      #             connection: db)
      #
      # The arguments are publish's, and so are the rules: the payload is
      # generated as JSON, the envelope gets a new id, now, the type, the
      # headers, and mq's origin. The relay sends it exactly as it was built,
      # so a message that went through the outbox is indistinguishable on the
      # wire from one published directly.
      #
      # delay: (seconds) or at: (a Time) makes it a delayed message, due from
      # when the record is built: the relay publishes it into the delay
      # cascade with whatever is left, so a relay that runs late does not
      # make it later (docs/delays.md).
      def self.record(mq, payload, to:, exchange: "", type: nil, headers: nil, delay: nil, at: nil,
                      partition_key: nil, partitions: nil)
        unless mq.is_a?(Connection)
          raise ConfigurationError, "Patterns.record needs the AceMQ::AMQP::Connection whose origin the message " \
                                    "carries, got #{mq.class}"
        end

        # publish's own preparation (JSON, and the envelope core's envelope_for
        # makes), so the two paths cannot drift apart.
        out, = mq.__send__(:outgoing, payload, to, exchange, nil, type, headers, delay: delay, at: at,
                                                                              partition: Connection.partition(partition_key, partitions))
        OutboxRecord._build(out)
      end

      # One message waiting to be added to the outbox (Patterns.record builds
      # it): where it goes, the JSON body and the envelope it will travel with.
      class OutboxRecord
        def self.new(*)
          raise NoMethodError, "build an OutboxRecord with Patterns.record(mq, payload, to:, exchange:, type:, headers:)"
        end

        def payload = JSON.parse(body)
        def id = envelope.id

        def inspect
          "#<AceMQ::AMQP::Patterns::OutboxRecord exchange=#{exchange.inspect} routing_key=#{routing_key.inspect} " \
            "id=#{id.inspect}>"
        end
      end
    end
  end
end
