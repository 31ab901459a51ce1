# frozen_string_literal: true

require "acemq/amqp"
require "acemq/amqp/sql"
require "acemq/amqp/patterns/instrumentation"
require "acemq/amqp/patterns/pipeline"
require "acemq/amqp/patterns/idempotency"
require "acemq/amqp/patterns/in_memory_idempotency_store"
require "acemq/amqp/patterns/sql_idempotency_store"
require "acemq/amqp/patterns/outbox"

module AceMQ
  module AMQP
    # Patterns that wrap a handler and hand back a handler, so they compose
    # without any of them knowing about the others: a handler is anything
    # answering call(message) and returning an Ack.
    module Patterns
      # Wrap the block (the real handler) in an idempotency guard, and return
      # it as a Proc, which is why it goes into consume with &:
      #
      #   mq.consume("payments", &Patterns.idempotent(store) do |message|
      #     Payments.charge!(message.payload["order_id"])
      #     Ack.accept
      #   end)
      #
      # The block is called as it is, not instance_exec'd: `accept` inside it
      # is its defining self's own. key: finds the key (default: the envelope
      # id); prefix it, because one table serves every consumer. The returned
      # Proc answers stats (the guard's counters; :duplicates is the one to
      # graph) and guard.
      def self.idempotent(store, key: nil, keep_order: false, &handler)
        raise ConfigurationError, "Patterns.idempotent needs a block: the handler it guards" unless handler

        Idempotent.build(with_idempotency(store, key: key, keep_order: keep_order), handler)
      end

      # The same guard as middleware, for a pipeline:
      #
      #   Patterns.pipeline(Patterns.with_idempotency(store), handler)
      def self.with_idempotency(store, key: nil, keep_order: false)
        Idempotency.new(store, key: key, keep_order: keep_order)
      end

      # A store option given in seconds, as a Float, or a ConfigurationError
      # naming the option.
      def self.seconds(name, value)
        Float(value)
      rescue TypeError, ArgumentError
        raise ConfigurationError, "#{name}: is a number of seconds, got #{value.inspect}"
      end
    end
  end
end
