# frozen_string_literal: true

require "acemq/amqp/result"

module AceMQ
  module AMQP
    # What Connection's dead-letter calls return (Result: a reader per
    # field, to_h the Hash they returned before).
    module DeadLetters
      # One dead letter as it sits in {queue}.dlq (Connection#peek_dead_letters,
      # Page#dead_letters): id, type, attempt, reason, error_class,
      # backtrace (x-acemq-backtrace: the first frames one a line; nil when
      # it had none), failed_at (a Time, nil when the header had none), body
      # (the bytes as they arrived), exchange and routing_key (where it was
      # first published), headers, and history (x-acemq-history: earlier
      # failures, oldest first).
      class Letter < Result
        fields :id, :type, :attempt, :reason, :error_class, :backtrace, :failed_at, :body, :exchange, :routing_key,
               :headers, :history, as: "letter",
               returned_by: "a dead letter (peek_dead_letters, browse_dead_letters) is a DeadLetters::Letter"

        # From the engine's Connection::DeadLetter: failed_at from seconds
        # to a Time, history out of its header.
        def self.from(d)
          headers = d.headers
          new(id: d.id, type: d.type, attempt: d.attempt, reason: d.reason, error_class: d.error_class,
              backtrace: d.backtrace, failed_at: d.failed_at && Time.at(d.failed_at), body: d.body, exchange: d.exchange,
              routing_key: d.routing_key, headers: headers, history: Array(headers["x-acemq-history"]))
        end
      end

      # One page of Connection#browse_dead_letters: dead_letters (Letters),
      # scanned, more, moved, partial, total, gave_up and most_held (the
      # method says what each means). more and partial are true or false,
      # and answer more? and partial? too.
      class Page < Result
        fields :dead_letters, :scanned, :more, :moved, :partial, :total, :gave_up, :most_held,
               as: "page",
               returned_by: "Connection#browse_dead_letters returns a DeadLetters::Page"

        def more? = more
        def partial? = partial
        def gave_up? = gave_up
      end

      # Connection#replay_dead_letters: how many went back to the queue,
      # and how many matched but were skipped.
      class ReplayReport < Result
        fields :replayed, :skipped, as: "report",
               returned_by: "Connection#replay_dead_letters returns a DeadLetters::ReplayReport"
      end

      # Connection#discard_dead_letters: how many were removed, and how
      # many matched but were skipped.
      class DiscardReport < Result
        fields :discarded, :skipped, as: "report",
               returned_by: "Connection#discard_dead_letters returns a DeadLetters::DiscardReport"
      end

      # Connection#purge_dead_letters: how many were removed.
      class PurgeReport < Result
        fields :discarded, as: "report",
               returned_by: "Connection#purge_dead_letters returns a DeadLetters::PurgeReport"
      end
    end
  end
end
