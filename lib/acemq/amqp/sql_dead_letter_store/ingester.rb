# frozen_string_literal: true

module AceMQ
  module AMQP
    class SQLDeadLetterStore
      # A thread that takes one DLQ into the store: each batch inserted in
      # one transaction, committed, then acknowledged. Built by
      # SQLDeadLetterStore#ingest.
      #
      # The DLQ is consumed exclusively: while another ingester (this
      # process or another, this host or another) has it, this one stands
      # by (standby? true, last_error says why, logged once) and asks again
      # every retry_every: seconds. A database failure acknowledges nothing:
      # the subscription closes, what it held goes back to the DLQ, and it
      # tries again after retry_every:.
      class Ingester
        # received: the deliveries this ingester committed and acknowledged,
        # counted after the acknowledgement, so a moment after their rows
        # can be read.
        attr_reader :queue, :received, :last_error

        def initialize(store, mq, queue, prefetch: 200, batch: 100, linger: 0.02, retry_every: 5, max_age: nil,
                       max_count: nil, prune_every: 60, logger: nil)
          @store = store
          @mq = mq
          @queue = queue
          @prefetch = SQLDeadLetterStore.whole(:prefetch, prefetch, 1, 65_535)
          @batch = SQLDeadLetterStore.whole(:batch, batch, 1, 10_000)
          @linger = SQLDeadLetterStore.seconds(:linger, linger)
          # A standby asking again at once, for ever, is a busy loop on the
          # broker: at least 10 ms.
          @retry = SQLDeadLetterStore.seconds(:retry_every, retry_every, min: 0.01)
          @retention = (max_age || max_count) ? { max_age: max_age, max_count: max_count } : nil
          @prune_every = SQLDeadLetterStore.seconds(:prune_every, prune_every, min: 0.01)
          @logger = logger
          @received = 0
          @active = false
          @standby = false
          @stopping = false
          @thread = Thread.new { run }
          @thread.name = "acemq-dead-letters-#{queue}"
        end

        # It has the DLQ now.
        def active? = @active

        # Another ingester has the DLQ; this one asks again every retry_every:.
        def standby? = @standby

        # Stop: a batch being inserted is committed and acknowledged first;
        # what is not yet in a batch goes back to the DLQ. True when the
        # thread ended within timeout: seconds.
        def stop(timeout: 10)
          @stopping = true
          !@thread.join(timeout).nil?
        end

        private

        def run
          last_prune = nil
          until @stopping
            feed = open_feed or next
            @active = true
            @standby = false
            begin
              until @stopping
                if @retention && (last_prune.nil? || monotonic - last_prune >= @prune_every)
                  last_prune = monotonic
                  @store.prune(queue: @queue, **@retention)
                end
                @received += @store.ingest_batch(feed, @batch, @linger, 0.25)
              end
            rescue StandardError => e
              note(e, "cannot ingest #{@queue}.dlq: #{e.message}; trying again in #{@retry}s")
              pause
            ensure
              @active = false
              feed.close
            end
          end
        end

        def open_feed
          SQLDeadLetterStore._open_feed(@mq, @queue, @prefetch)
        rescue AccessRefused => e
          note(e, "#{@queue}.dlq is consumed exclusively by another ingester; standing by, asking again every #{@retry}s") unless @standby
          @standby = true
          pause
          nil
        rescue StandardError => e
          note(e, "cannot consume #{@queue}.dlq: #{e.message}; trying again in #{@retry}s")
          pause
          nil
        end

        def note(error, message)
          @last_error = error
          @logger&.warn("acemq: #{message}")
        end

        # The retry wait, in slices so that stop is not kept waiting.
        def pause
          until_at = monotonic + @retry
          sleep([0.1, until_at - monotonic].min) while !@stopping && monotonic < until_at
        end

        def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end
    end
  end
end
