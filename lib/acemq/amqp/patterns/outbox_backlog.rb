# frozen_string_literal: true

require "acemq/amqp/result"

module AceMQ
  module AMQP
    module Patterns
      # SQLOutboxStore#backlog: count (rows waiting, leased ones included),
      # oldest_age (seconds the oldest has waited, nil when empty) and
      # stuck (rows that have failed at least once).
      class OutboxBacklog < Result
        fields :count, :oldest_age, :stuck, as: "backlog",
               returned_by: "SQLOutboxStore#backlog returns a Patterns::OutboxBacklog"
      end

      # One row of SQLOutboxStore#stuck: id, exchange, routing_key,
      # message_id, attempts, last_error, and next_attempt_at and
      # created_at (the database's times, as Time).
      class OutboxStuckRow < Result
        fields :id, :exchange, :routing_key, :message_id, :attempts, :last_error, :next_attempt_at, :created_at,
               as: "row", returned_by: "SQLOutboxStore#stuck returns Patterns::OutboxStuckRow objects"

        # From the engine's SQLOutboxStore::StuckRecord, whose times are ms
        # since the epoch.
        def self.from(r)
          new(id: r.id, exchange: r.exchange, routing_key: r.routing_key, message_id: r.message_id, attempts: r.attempts,
              last_error: r.last_error, next_attempt_at: Time.at(r.next_attempt_at / 1000.0),
              created_at: Time.at(r.created_at / 1000.0))
        end
      end
    end
  end
end
