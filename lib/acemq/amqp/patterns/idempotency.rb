# frozen_string_literal: true

module AceMQ
  module AMQP
    module Patterns
      # The idempotency guard as middleware: Patterns.with_idempotency returns
      # one, Patterns.idempotent wraps one round a block. What it does is
      # decided by the engine's guard (the same rules a Rust consumer gets),
      # in order:
      #
      # - no key (nil or ""): Ack.reject with FatalError — the same key
      #   function finds the same nothing on every retry, so the message goes
      #   to {queue}.dlq with the reason;
      # - the store's first_time? raises: Ack.retry, handler not run — the
      #   store is what is broken, and carrying on could be the duplicate it
      #   exists to prevent;
      # - not the first time and confirmed: Ack.accept, handler not run — a
      #   duplicate is the broker doing its job, not an error;
      # - not the first time and only claimed (a handler still running, or one
      #   that died): Ack.wait, handler not run, so the message comes back
      #   rather than being dropped with its work undone — round the ladder
      #   without spending attempts, for as long as the claim can live (a
      #   store with no claim_timeout: Ack.retry);
      # - the first time: the handler runs; if it accepted, the key is
      #   confirmed (when the store answers confirm), otherwise forgotten
      #   (when it answers forget) so the retry really runs. A handler that
      #   raises has its key forgotten and the same exception re-raised.
      class Idempotency
        DEFAULT_KEY = ->(message) { message.is_a?(Message) ? message.id : message.envelope&.id }

        attr_reader :store, :guard

        # keep_order: for a consumer whose order matters (a partition, a
        # single active consumer): a message whose key another worker holds a
        # live claim on waits here, in place, instead of going round the
        # ladder behind later messages of its key (see #hold).
        def initialize(store, key: nil, keep_order: false)
          unless store.respond_to?(:first_time?)
            raise ConfigurationError, "#{store.inspect} is not an idempotency store: it must answer first_time?(key) " \
                                      "(and may answer confirm(key), forget(key), confirmed?(key))"
          end
          if key && !key.respond_to?(:call)
            raise ConfigurationError, "key: must answer call(message) (a lambda), got #{key.inspect}"
          end

          @store = store
          @key = key || DEFAULT_KEY
          @keep_order = keep_order ? true : false
          @guard = NativeGuard.new
        end

        def keep_order? = @keep_order

        # Hold claimed keys in place from now on: what consume(keep_order:
        # true) does to the Patterns.idempotent handler it is given.
        def keep_order!
          @keep_order = true
          self
        end

        # The middleware: app is the guarded handler. The engine's guard
        # decides whether it runs (NativeGuard::Decision), and has delivered
        # the idempotency event of a message it does not run by the time it
        # answers (message is what the event is about).
        def call(message, app)
          key, why = key_of(message)
          decision = @guard._before(@store, key, why, message)
          decision = hold(message, key, decision) if @keep_order && decision.event == :in_progress
          decision.run? ? run(message, app, decision.key) : decision.ack
        end

        # The same for a batch: the keys are claimed together and the
        # accepted ones confirmed together (one transaction each on a SQL
        # store), each message decided exactly as call would decide it, and
        # the handlers run one by one in between. Returns one result per
        # message: its Ack, or the StandardError its handler raised (after
        # its key was forgotten). The subscription acknowledges only after
        # this returns, so the keys are facts before any delivery is settled.
        def call_many(messages, app)
          found = messages.map { |m| key_of(m) }
          decisions = @guard._before_many(@store, found.map(&:first), found.map(&:last), messages)
          results = Array.new(messages.size)
          settled = []
          pending = decisions.select(&:run?).map(&:key)
          # Keys this batch claimed itself: confirmed only after the batch,
          # so a later copy in it is never held for them (it would wait out
          # its own batch's claim).
          own = pending.map(&:b)
          begin
            messages.each_with_index do |message, i|
              decision = decisions[i]
              # Held in place on a keep_order consumer (see #hold), before
              # the later messages of the batch run.
              if @keep_order && decision.event == :in_progress && !own.include?(found[i].first.to_s.b)
                decision = decisions[i] = hold(message, found[i].first, decision)
                pending.unshift(decision.key) if decision.run?
              end
              # Unrun: its event was delivered as the guard decided.
              next results[i] = decision.ack unless decision.run?

              results[i] = begin
                app.call(message)
              rescue StandardError => e
                e
              end
              pending.shift
              settled << [decision.key, results[i]]
            end
          ensure
            # A handler that never finished (Thread#kill, Interrupt, throw),
            # and every message after it that never ran: their keys must not
            # stand, and the guard counts them as abandoned.
            by_key = decisions.each_with_index.filter_map { |d, i| [d.key, messages[i]] if d.run? }.to_h
            failed = @guard._after_many(@store, settled, pending, by_key)
            if failed
              key = settled.first&.first || pending.first
              report_after(key, settled.any? { |_, r| r.is_a?(Ack) && r.accept? }, failed)
            end
          end
          results
        end

        # The guard's counters: duplicates (first_time? answered false for a
        # confirmed key), in_progress (for a key only claimed), runs,
        # missing_keys, store_errors, confirmed, forgotten, confirm_errors,
        # forget_errors, abandoned.
        def stats = @guard.stats

        # The store's claim timeout in seconds, nil for a store whose claims
        # do not expire: a consumer's handler deadline must not be longer.
        def claim_timeout
          @store.respond_to?(:claim_timeout) ? Float(@store.claim_timeout) : nil
        end

        def inspect = "#<AceMQ::AMQP::Patterns::Idempotency store=#{@store.class}>"

        private

        # The key, or nil and why it could not be had. A key: function that
        # raises is the same as a missing key — the same function does the
        # same next time — so the guard rejects it as fatal, with this reason
        # instead of "missing". Raised out of the guard instead, it would be
        # retried up the whole ladder, and in a batch it would end the
        # handler thread. A key that is not UTF-8 text is the engine's to
        # refuse (one rule, in core), the same way.
        def key_of(message)
          [@key.call(message), nil]
        rescue StandardError => e
          [nil, "idempotency key: raised #{e.class}: #{e.message.to_s[0, 200]}; the same key: raises again on " \
                "every retry, so the message is rejected: make key: return nil or text for every message"]
        end

        # Hold a delivery whose key is claimed by another worker, on a
        # keep_order consumer: ask the store again (core's schedule: 50 ms,
        # doubling to 1 s) until the claim is confirmed (a duplicate, accepted
        # unrun), forgotten or expired (it runs here, now), or for at most the
        # claim's lease and one more look. The partition stalls meanwhile:
        # its later messages wait behind this one, which is the order. Sent
        # round the ladder instead, it would run after them. A claim whose
        # worker has exited is taken over by the store at the first look.
        # Past the limit (somebody claimed the key after the hold began) the
        # first decision stands: round the ladder, as without keep_order.
        def hold(message, key, decision)
          lease = claim_timeout
          return decision unless lease

          limit = Process.clock_gettime(Process::CLOCK_MONOTONIC) + lease + NativeGuard::HOLD_POLL_MAX
          delivery = message.respond_to?(:native_delivery) ? message.native_delivery : nil
          delivery = nil unless delivery.respond_to?(:_restart_deadline)
          poll = nil
          first = true
          loop do
            poll = poll ? [poll * 2, NativeGuard::HOLD_POLL_MAX].min : NativeGuard::HOLD_POLL_FIRST
            return decision if Process.clock_gettime(Process::CLOCK_MONOTONIC) + poll > limit

            # Holding is not handling: the handler deadline (there so that a
            # handler never outlives its own claim) counts from the last
            # look, and from the claim once there is one. Left counting from
            # the hand-out, a hold close to the lease would have the deadline
            # settle the message as a retry, and the subscription's
            # replacement thread take later messages of the partition
            # alongside it. The hold itself is bounded by the lease.
            delivery&._restart_deadline
            sleep poll
            now = @guard._recheck(@store, key, first, message)
            first = false
            next if now.event == :in_progress

            delivery&._restart_deadline if now.run?
            return now
          end
        end

        def run(message, app, key)
          finished = false
          begin
            result = app.call(message)
            finished = true
          rescue StandardError => e
            finished = true
            settle(message, key, e)
            raise
          ensure
            # Not finished and not a StandardError: Thread#kill, Interrupt,
            # throw. The handler never finished, so the key must not stand;
            # whatever it was goes on untouched.
            unless finished
              @guard._abandon(@store, key, message) # a failure is its forget_failed event
            end
          end
          settle(message, key, result)
          result
        end

        # The guard reads the handler's result as the consumer does.
        def settle(message, key, result)
          failed = @guard._after(@store, key, result, message)
          report_after(key, result.is_a?(Ack) && result.accept?, failed) if failed
        end

        # The handler's outcome stands: the work was done (or not), and
        # settling differently would only add a second problem. The engine
        # has delivered the failure as an idempotency event already; with
        # nobody listening to those, it is a warning.
        def report_after(key, confirming, failed)
          return if AceMQ::Events.listening?("idempotency.acemq")

          warn("acemq: idempotency #{confirming ? 'confirm' : 'forget'} failed for #{key.inspect}: #{failed}")
        end
      end

      # What Patterns.idempotent returns: a Proc (so it goes into consume
      # with &) that also answers stats and guard.
      class Idempotent < Proc
        def self.build(middleware, handler)
          proc = new { |message| middleware.call(message, handler) }
          proc.instance_variable_set(:@middleware, middleware)
          proc.instance_variable_set(:@handler, handler)
          proc
        end

        # The guard's counters (see Idempotency#stats).
        def stats = @middleware.stats

        # Several messages at once (see Idempotency#call_many): what a
        # subscription with batch: calls.
        def call_many(messages) = @middleware.call_many(messages, @handler)

        # The middleware underneath.
        def guard = @middleware

        # The store's claim timeout (see Idempotency#claim_timeout).
        def claim_timeout = @middleware.claim_timeout
      end
    end
  end
end
