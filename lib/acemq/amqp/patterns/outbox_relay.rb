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
      # A started relay sweeps as soon as rows are committed rather than an
      # interval later: on PostgreSQL every add sends a NOTIFY that is
      # delivered at commit, and the relay LISTENs on a connection of its own
      # (opened with the store connection's settings, or listen:); on SQLite
      # an add in this process wakes a relay whose store is path: (its claim
      # then waits on the adder's write lock, without the GVL, and runs just
      # after the commit). interval is the fallback poll: for rows added by
      # other processes on SQLite, or when no wake-up is available.
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
        #
        # interval: (default 1 s) and batch_size: (default 100) are core's
        # RelayOptions, defaults and checks included. listen: is the
        # PostgreSQL connection settings (a conninfo string or hash) to LISTEN
        # with, false for none; by default those of the store's connection.
        def initialize(mq, store, interval: nil, batch_size: nil, on_error: nil, listen: nil)
          raise ConfigurationError, "OutboxRelay needs an AceMQ::AMQP::Connection, got #{mq.class}" unless mq.is_a?(Connection)
          raise ConfigurationError, "OutboxRelay needs a SQLOutboxStore, got #{store.class}" unless store.is_a?(SQLOutboxStore)

          @mq = mq
          @store = store
          @interval, @batch_size = OutboxRelay._options(interval.nil? ? nil : Patterns.seconds(:interval, interval),
                                                        batch_size.nil? ? nil : OutboxRelay.count(batch_size))
          @listen = listen.nil? ? store.pg_conninfo : listen
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

        def self.count(value)
          Integer(value)
        rescue TypeError, ArgumentError
          raise ConfigurationError, "batch_size: is a number of rows, got #{value.inspect}"
        end

        def running? = !!@thread&.alive?
        def closed? = @stopping

        def inspect
          "#<AceMQ::AMQP::Patterns::OutboxRelay table=#{@store.table.inspect} interval=#{@interval} " \
            "batch_size=#{@batch_size}#{running? ? ' running' : ''}>"
        end

        private

        # [confirmed, again, claimed, failed, held ids, in flight]. again is
        # core's rule (a full batch with no failure: more is waiting, sweep
        # now). With hold (the relay's own thread), the confirmed rows are
        # not deleted yet: their ids come back for _finish (core's
        # Swept::defer_delete) to hold for the next claim, which deletes
        # them in its own commit, or to delete now; and a full batch comes
        # back in flight, sent but not settled, for the next sweep to settle
        # after its claim (so the claim runs while the broker confirms).
        # done: ids held by the previous sweep; in_flight: its batch.
        def sweep_once(done = [], hold: false, in_flight: nil)
          claimed, confirmed, failed, again, held, failures, in_flight = @sweeping.synchronize do
            @store.__send__(:_sweep, @mq, @batch_size, done, hold, in_flight)
          end
          failures.each { |error, exchange, routing_key| report(error, exchange, routing_key) }
          [confirmed, again, claimed, failed, held, in_flight]
        end

        # How long one wait lasts at most before close is noticed. Not a
        # poll of the database: nothing is queried between slices.
        SLICE = 0.25

        def run
          listener = nil
          held = []
          in_flight = nil
          local = @store.__send__(:_wakes_on_add?)
          until @stopping
            listener ||= open_listener
            # Read before the sweep: what is added or committed while it runs
            # ends the wait below at once.
            seen = @store.__send__(:_wake_seen) if local
            listener = drain(listener)
            again = false
            previous, in_flight = in_flight, nil
            begin
              _, again, claimed, failed, ids, in_flight = sweep_once(held, hold: true, in_flight: previous)
              held = []
              woken = !ids.empty? && woken?(listener, seen)
              held = @sweeping.synchronize do
                @store.__send__(:_finish, ids, [claimed, ids.size, failed], @batch_size, woken)
              end
            rescue StandardError => e
              report(e, nil, nil)
              # A sweep that failed as a whole (the database) is tried again
              # after the interval, as core's relay does, not at once: what
              # it held and the batch still in flight go with that sweep.
              in_flight ||= previous
              listener = wait(listener, local ? seen : nil)
              next
            end
            # Rows held back or in flight mean core expects the next claim at once.
            next if again || !held.empty? || in_flight

            listener = wait(listener, local ? seen : nil)
          end
        ensure
          finish_held(held, in_flight)
          listener&.close
        end

        # Whether a wake-up came while the last sweep published.
        def woken?(listener, seen)
          return listener.pending? if listener
          return @store.__send__(:_wake_seen) != seen if seen

          false
        rescue StandardError
          false
        end

        # Stopping: the batch in flight is settled like any other (its
        # failures reported), then what is held is deleted.
        def finish_held(held, in_flight)
          held ||= []
          if in_flight
            failures = @sweeping.synchronize { @store.__send__(:_settle_in_flight, in_flight, held) }
            failures.each { |error, exchange, routing_key| report(error, exchange, routing_key) }
          elsif !held.empty?
            @sweeping.synchronize { @store.__send__(:_delete_held, held) }
          end
        rescue StandardError => e
          # Not lost: they are published again once their lease runs out.
          report(e, nil, nil)
        end

        # Until a wake-up or interval: a NOTIFY on the listener, an add in
        # this process, or close. The listener back, nil if it failed.
        def wait(listener, seen)
          unless listener || seen
            @lock.synchronize { @wake.wait(@lock, @interval) unless @stopping }
            return nil
          end

          deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @interval
          until @stopping
            left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
            break if left <= 0

            slice = [left, SLICE].min
            break if listener ? listener.wait(slice) : @store.__send__(:_wait_for_add, seen, slice)
          end
          listener
        rescue StandardError => e
          report(e, nil, nil)
          listener&.close
          nil
        end

        def drain(listener)
          listener&.drain
          listener
        rescue StandardError => e
          report(e, nil, nil)
          listener.close
          nil
        end

        def open_listener
          return nil unless @listen

          OutboxListener.new(@listen, @store.__send__(:_channel))
        rescue StandardError => e
          # Without it the relay still sweeps every interval; say why it is slower.
          report(e, nil, nil)
          nil
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
