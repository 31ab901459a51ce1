# frozen_string_literal: true

module AceMQ
  module AMQP
    class SQLDeadLetterStore
      # One dead letter in the store. body is the bytes as they arrived (a
      # binary String); headers and properties are Hashes as a consumed
      # message's; history is x-acemq-history in whatever shape it came;
      # failed_at and ingested_at are seconds since the epoch.
      Letter = Struct.new(:id, :queue, :message_id, :content_hash, :body, :headers, :properties, :type, :reason,
                          :error_class, :attempt, :exchange, :routing_key, :failed_at, :ingested_at, :history,
                          :backtrace, keyword_init: true) do
        # The body as UTF-8 text to show, bytes that are not UTF-8 replaced.
        def body_text = body.dup.force_encoding(Encoding::UTF_8).scrub

        def failed_time = Time.at(failed_at)
      end
    end
  end
end
