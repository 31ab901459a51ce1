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
      # (opened with the store connection's settings, or listen:), on a
      # second thread of its own; on SQLite
      # an add in this process wakes a relay whose store is path: (its claim
      # then waits on the adder's write lock, without the GVL, and runs just
      # after the commit). interval is the fallback poll: for rows added by
      # other processes on SQLite, or when no wake-up is available.
      #
      # What a sweep does (claim, settle the batch before, send, keep in
      # flight or settle, complete, hold or delete) is core's relay cycle, the
      # one the Rust relay runs; Cycle drives it on the calling Ruby thread:
      # the claim and the completion through the store's connection (a Ruby
      # driver can be used nowhere else), the publish and its confirms
      # without the GVL; the wait between sweeps is core's too. This class
      # keeps the threads and on_error. Several relays, in one process or many, can
      # share one table: a claimed row is leased to one of them (BEGIN
      # IMMEDIATE on SQLite, FOR UPDATE SKIP LOCKED on PostgreSQL).
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
        # interval: and batch_size: are core's RelayOptions, defaults
        # (DEFAULT_INTERVAL, DEFAULT_BATCH_SIZE) and checks included. listen: is the
        # PostgreSQL connection settings (a conninfo string or hash) to LISTEN
        # with, false for none; by default those of the store's connection.
        def initialize(mq, store, interval: nil, batch_size: nil, on_error: nil, listen: nil)
          raise ConfigurationError, "OutboxRelay needs an AceMQ::AMQP::Connection, got #{mq.class}" unless mq.is_a?(Connection)
          raise ConfigurationError, "OutboxRelay needs a SQLOutboxStore, got #{store.class}" unless store.is_a?(SQLOutboxStore)

          @mq = mq
          @store = store
          options = OutboxRelay._options(interval.nil? ? nil : Patterns.seconds(:interval, interval),
                                         batch_size.nil? ? nil : OutboxRelay.count(batch_size))
          @interval = options.interval
          @batch_size = options.batch_size
          @listen = listen.nil? ? store.pg_conninfo : OutboxRelay.listen_setting(listen)
          if on_error && !on_error.respond_to?(:call)
            raise ConfigurationError, "on_error: must answer call(error, exchange:, routing_key:)"
          end

          @on_error = on_error
          @cycle = Cycle._new(store, @batch_size)
          # One sweep at a time per relay: a sweep from the application
          # (flushing at the end of a request) and one from the relay's thread
          # would otherwise interleave statements on the store's connection.
          @sweeping = Mutex.new
          @lock = Mutex.new
          @thread = nil
          @stopping = false
        end

        # Publish one batch now and return how many went out (were
        # confirmed). What a test calls instead of waiting for a tick, and
        # what an application calls to flush its outbox at the end of a
        # request. Rows that fail are reported to on_error and retried after
        # their backoff; a database error is raised.
        def sweep
          locked { |failures| @cycle._sweep(@store, @mq, failures) }
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
            # Ends the wait between sweeps at once (core's wait).
            @cycle._interrupt
            @thread
          end
          thread&.join unless thread == Thread.current
          nil
        end

        # listen: as given: false, or PostgreSQL's connection settings. An
        # empty or blank one would have libpq fall back to its defaults (the
        # OS user's database), and the relay would listen where no add
        # notifies, silently.
        def self.listen_setting(value)
          return false if value == false
          return value if value.is_a?(String) && !value.strip.empty?
          return value if value.is_a?(Hash) && !value.empty?

          raise ConfigurationError, "listen: takes PostgreSQL's connection settings (a conninfo String such as " \
                                    "\"host=db dbname=app\" or a URL, or a Hash), or false for none; got #{value.inspect[0, 80]}"
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

        # The cycle's calls, one at a time (see @sweeping). The failures it
        # adds go to on_error once the lock is let go, so a slow on_error
        # holds up no sweep, and those of a call that raised are told too.
        def locked
          failures = []
          @sweeping.synchronize { yield failures }
        ensure
          failures.each { |f| report(f.error, f.exchange, f.routing_key) }
        end

        # How long the LISTEN thread's wait for a notification lasts before
        # it looks whether the relay is closing.
        SLICE = 0.25
        # Its pause before listening again after losing its connection,
        # doubling: core's listener's (sql/postgres.rs).
        RELISTEN = (0.1..5.0).freeze

        # Sweep; wait (core's wait: rows committed, close, or interval); again.
        # A PostgreSQL store's notifications reach that wait through a
        # thread of the relay's that LISTENs and tells the cycle.
        def run
          listening = start_listening
          wakes = listening || @cycle.wakes_on_add?
          until @stopping
            # Read before the sweep: what is added or committed while it runs
            # ends the wait below at once.
            seen = @cycle.wake_seen
            woken = -> { wakes && @cycle.wake_seen != seen }
            # True: more is waiting, or a claim must come at once for what
            # the cycle holds or has in flight.
            next if sweep_again?(woken)

            @cycle._wait(wakes ? seen : nil, @interval)
          end
        ensure
          stop_cycle
          # It sees @stopping within a SLICE; a connect to an unreachable
          # server can take longer, and is not worth holding close for.
          listening&.join(2)&.then { nil } || listening&.kill
        end

        # One sweep of the cycle. A sweep that failed as a whole (the
        # database) was told to on_error and waits out the interval.
        def sweep_again?(woken)
          locked { |failures| @cycle._step(@store, @mq, woken, failures) }
        rescue StandardError => e
          report(e, nil, nil)
          false
        end

        # Stopping: the batch in flight is settled like any other (its
        # failures told), then what is held is deleted.
        def stop_cycle
          locked { |failures| @cycle._stop(@store, @mq, failures) }
        rescue StandardError => e
          # Not lost: they are published again once their lease runs out.
          report(e, nil, nil)
        end

        # The LISTEN thread, on PostgreSQL (nil elsewhere, or with listen:
        # false): each notification, and each time it listens again after
        # losing its connection (rows may have been committed meanwhile),
        # wakes the relay. A failure is told to on_error; it listens again
        # after a pause doubling from 0.1 s to 5 s.
        def start_listening
          return nil unless @listen

          thread = Thread.new do
            pause = RELISTEN.begin
            until @stopping
              pause = listen_once ? RELISTEN.begin : [pause * 2, RELISTEN.end].min
              deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + pause
              sleep(SLICE) while !@stopping && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
            end
          end
          thread.name = "acemq-outbox-listen" if thread.respond_to?(:name=)
          thread
        end

        # Listen until the connection fails or the relay closes; whether it
        # got to listen at all.
        def listen_once
          listener = OutboxListener.new(@listen, @store.channel)
          begin
            @cycle._notify
            @cycle._notify if listener.wait(SLICE) until @stopping
          rescue StandardError => e
            report(e, nil, nil)
          ensure
            listener.close
          end
          true
        rescue StandardError => e
          # Without it the relay still sweeps every interval; say why it is slower.
          report(e, nil, nil)
          false
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
