# frozen_string_literal: true

module AceMQ
  module AMQP
    # Where a delivery came from, and every AMQP property it carried
    # (Properties; nil on a message built by hand).
    Delivery = Struct.new(:queue, :exchange, :routing_key, :redelivered, :properties, keyword_init: true) do
      def redelivered? = !!redelivered
    end
  end
end
