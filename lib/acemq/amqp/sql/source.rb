# frozen_string_literal: true

module AceMQ
  module AMQP
    module SQL
      # A connection source: what a store asks, once per operation, for the
      # adapter to run that operation on (checkout: the engine calls it). A
      # caller that uses the source as an adapter itself gets each statement
      # on a checkout of its own.
      module Source
        def dialect = checkout.dialect
        def execute(sql, params) = checkout.execute(sql, params)
        def query(sql, params) = checkout.query(sql, params)
      end
    end
  end
end
