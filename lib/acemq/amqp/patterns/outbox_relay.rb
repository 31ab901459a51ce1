# frozen_string_literal: true

module AceMQ
  module AMQP
    module Patterns
      # Publishes what the outbox holds: claims a batch of due rows, publishes
      # them and waits for their confirms together, deletes what the broker
      # confirmed and backs off what it did not.
      #
      #   relay = Patterns::OutboxRelay.new(mq, store, interval: 1)
      #   relay.start
      #   at_exit { relay.close }
      #
      # The claim and the completion run on the calling Ruby thread through
      # the store's connection (a Ruby driver can be used nowhere else); the
      # publish waits for its confirms without the GVL. Several relays, in one
      # process or many, can share one table: a claimed row is leased to one
      # of them (BEGIN IMMEDIATE on SQLite, FOR UPDATE SKIP LOCKED on
      # PostgreSQL).
      #
      # At least once, deliberately: a row is deleted only after its confirm,
      # so a crash in between publishes it again. Patterns.idempotent is what
      # makes that duplicate harmless.
      class OutboxRelay
        attr_reader :store, :interval, :batch_size

        # on_error: is called as on_error.call(error, exchange:, routing_key:)
        # for every row that could not be published, and with exchange: nil,
        # routing_key: nil for a sweep that failed as a whole (the database
        # was unreachable). Without one, a relay whose sweeps all fail is an
        # outbox filling up and nothing else to show for it.
        def initialize(mq, store, interval: 1, batch_size: 100, on_error: nil)
          raise ConfigurationError, "OutboxRelay needs an AceMQ::AMQP::Connection, got #{mq.class}" unless mq.is_a?(Connection)
          raise ConfigurationError, "OutboxRelay needs a SQLOutboxStore, got #{store.class}" unless store.is_a?(SQLOutboxStore)

          @mq = mq
          @store = store
          @interval = Float(interval)
          @batch_size = Integer(batch_size)
          raise ConfigurationError, "interval: must be more than 0 seconds" unless @interval.positive?
          raise ConfigurationError, "batch_size: must be at least 1" if @batch_size < 1
          if on_error && !on_error.respond_to?(:call)
            raise ConfigurationError, "on_error: must answer call(error, exchange:, routing_key:)"
          end

          @on_error = on_error
          # One sweep at a time per relay: a sweep from the application
          # (flushing at the end of a request) and one from the relay's thread
          # would otherwise interleave statements on the store's connection.
          @sweeping = Mutex.new
          @lock = Mutex.new
          @wake = ConditionVariable.new
          @thread = nil
          @stopping = false
        end

        # Publish one batch now and return how many went out (were
        # confirmed). What a test calls instead of waiting for a tick, and
        # what an application calls to flush its outbox at the end of a
        # request. Rows that fail are reported to on_error and retried after
        # their backoff; a database error is raised.
        def sweep
          sweep_once.first
        end

        # Sweep every interval on a thread the relay owns, and again at once
        # while batches come back full. Starting a started relay does nothing.
        def start
          @lock.synchronize do
            raise ConnectionClosed, "this outbox relay is closed; build a new one to start again" if @stopping
            return self if @thread&.alive?

            @thread = Thread.new { run }
            @thread.name = "acemq-outbox-relay" if @thread.respond_to?(:name=)
          end
          self
        end

        # Stop: the sweep in progress finishes (its confirmed rows are
        # deleted, its failures recorded), then the thread ends. Idempotent.
        def close
          thread = @lock.synchronize do
            @stopping = true
            @wake.broadcast
            @thread
          end
          thread&.join unless thread == Thread.current
          nil
        end

        def running? = !!@thread&.alive?
        def closed? = @stopping

        def inspect
          "#<AceMQ::AMQP::Patterns::OutboxRelay table=#{@store.table.inspect} interval=#{@interval} " \
            "batch_size=#{@batch_size}#{running? ? ' running' : ''}>"
        end

        private

        # [confirmed, claimed, failed]
        def sweep_once
          claimed, confirmed, failures = @sweeping.synchronize { @store.__send__(:_sweep, @mq, @batch_size) }
          failures.each { |error, exchange, routing_key| report(error, exchange, routing_key) }
          [confirmed, claimed, failures.size]
        end

        def run
          until @stopping
            again = false
            begin
              _, claimed, failed = sweep_once
              # A full batch that all went out means more is waiting: sweep
              # again now rather than an interval later. A batch with failures
              # does not: with the broker gone that would be a busy loop of
              # rows failing one after another.
              again = claimed >= @batch_size && failed.zero?
            rescue StandardError => e
              report(e, nil, nil)
            end
            next if again

            @lock.synchronize { @wake.wait(@lock, @interval) unless @stopping }
          end
        end

        def report(error, exchange, routing_key)
          @on_error&.call(error, exchange: exchange, routing_key: routing_key)
        rescue StandardError => e
          # A broken on_error must not stop the relay: the outbox would fill
          # up silently, which is what on_error is there to prevent.
          warn("acemq: outbox relay on_error raised #{e.class}: #{e.message}")
        end
      end
    end
  end
end
