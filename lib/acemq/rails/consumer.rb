# frozen_string_literal: true

module AceMQ
  module Rails
    # A consumer class: one queue, its retry ladder, its threads, and a
    # #call that returns an Ack. The runner (`acemq run`, `bin/rails
    # acemq:run`) finds every subclass, declares its topology, and keeps one
    # instance of it for the life of the process, calling it from the
    # consumer's threads.
    #
    #   class PaymentsConsumer < AceMQ::Rails::Consumer
    #     queue "shop.payments"
    #     bind "orders-events", routing_key: "order.placed"
    #     retries max_attempts: 5, initial_delay: 1, max_delay: 300
    #     concurrency 4
    #
    #     def call(message)
    #       Payments.charge!(message.payload["order_id"])
    #       accept
    #     end
    #   end
    #
    # Settings are inherited: an ApplicationConsumer with `retries` and no
    # `queue` gives every subclass its ladder and is itself never run.
    class Consumer
      # Every setting a class can make, with its default where one is the
      # library's (nil leaves the choice to the engine: prefetch and the
      # retry ladder have their defaults in core; concurrency is core's).
      SETTINGS = {
        queue: nil, queue_arguments: nil, queue_type: nil, retries: nil,
        concurrency: AMQP::CONSUME_DEFAULTS.fetch(:concurrency), prefetch: nil, batch: 1,
        bindings: [].freeze, on_error: nil, idempotency: nil, timeout: nil, circuit_breaker: nil, throttle: nil,
        partitions: nil, single_active_consumer: false
      }.freeze

      # What a partitions by: callable is given at publish time.
      Outgoing = Struct.new(:payload, :type, :headers)

      class << self
        # The classes to run: every subclass, at any depth, that names a
        # queue (one without is abstract, like an ApplicationConsumer) and is
        # still what its constant names (a class replaced by a reload in
        # development is not run twice). Eager-load first: a class not loaded
        # yet is not a subclass yet.
        def consumers
          found = []
          pending = Consumer.subclasses
          until pending.empty?
            klass = pending.shift
            pending.concat(klass.subclasses)
            found << klass if klass.queue_name && current?(klass)
          end
          found.uniq.sort_by(&:name)
        end

        # `queue "shop.payments"` names the queue (declared with its .dlq and
        # rungs at boot). `arguments:` are queue arguments (x-max-length, ...).
        def queue(name = nil, arguments: nil, type: nil)
          return queue_name if name.nil?

          name = name.to_s
          raise AMQP::ConfigurationError, "#{self}: queue needs a name" if name.empty?
          begin
            type &&= AMQP._queue_type(type.to_s)
          rescue AMQP::ConfigurationError => e
            raise AMQP::ConfigurationError, "#{self}: #{e.message}"
          end

          set(:queue, name)
          set(:queue_arguments, arguments.transform_keys(&:to_s).freeze) if arguments
          set(:queue_type, type) if type
          name
        end

        def queue_type = setting(:queue_type)

        def queue_name = setting(:queue)

        # The retry ladder: `retries max_attempts: 5, initial_delay: 1,
        # max_delay: 300` (seconds). Checked here, at class definition, so a
        # ladder that cannot work fails the boot rather than the first retry.
        def retries(**options)
          return setting(:retries) if options.empty?

          policy = AMQP::RetryPolicy.from(options)
          begin
            AMQP._check_retries(policy.max_attempts, policy.initial_delay, policy.max_delay)
          rescue AMQP::ConfigurationError => e
            raise AMQP::ConfigurationError, "#{self}: retries: #{e.message}"
          end

          set(:retries, policy)
        end

        # Handler threads for this consumer (default 1). Each needs a
        # database connection if the handler uses ActiveRecord: the runner
        # refuses to boot when the pool is smaller than the threads.
        def concurrency(count = nil)
          return setting(:concurrency) if count.nil?

          set(:concurrency, size(:concurrency, count))
        end

        # The handler deadline in seconds: a message whose handler has not
        # returned by then is retried (the handler is not interrupted; what
        # it returns later is discarded). Default core's DEFAULT_TIMEOUT, or
        # the idempotency store's claim_timeout when that is shorter; it must be
        # shorter than the broker's consumer_timeout (config.consumer_timeout).
        def timeout(seconds = nil)
          return setting(:timeout) if seconds.nil?

          set(:timeout, positive_seconds(:timeout, seconds))
        end

        # Deliveries in flight (default core's, ConsumeOptions::with_batches:
        # twice concurrency times batch, with a floor). Never unlimited.
        def prefetch(count = nil)
          return setting(:prefetch) if count.nil?

          set(:prefetch, size(:prefetch, count))
        end

        # Hand the idempotency guard up to `size` buffered deliveries at once
        # (one claim and one confirm transaction for all of them). Needs the
        # `idempotent` macro: a batch is the guard's, not the handler's.
        def batch(size = nil)
          return setting(:batch) if size.nil?

          set(:batch, size(:batch, size))
        end

        # Order per key across runners (docs/ordering.md): the queue becomes
        # `count` partition queues (`queue.p0` ...), each consumed by one
        # runner at a time (x-single-active-consumer, one handler thread per
        # partition), and a message goes to the partition its key hashes to.
        # Publish with `PaymentsConsumer.publish(payload)`; by: is called with
        # the outgoing message (payload, type, headers) and returns the key.
        #
        #   partitions 8, by: ->(m) { m.payload["account_id"] }
        def partitions(count = nil, by: nil)
          if count.nil?
            # `partitions ENV["N"], by: ...` with N unset would otherwise
            # read the setting and consume the plain queue, order lost.
            raise AMQP::ConfigurationError, "#{self}: partitions needs a count, e.g. partitions 8, by: ->(m) { ... }" if by

            return setting(:partitions)
          end
          raise AMQP::ConfigurationError, "#{self}: partitions needs by: (a callable returning the key)" unless by.respond_to?(:call)

          n = ruled { AMQP::Connection.partition_count(count).tap { |c| AMQP.partition_queues("check", c) } }
          set(:partitions, { count: n, by: by }.freeze)
        end

        # One consumer of the queue at a time across every runner
        # (x-single-active-consumer): the others stand by and the next takes
        # over, from where the first stopped, when it goes. With concurrency
        # 1 the queue is handled in the order it was published; partitions
        # are the same per key, with the work spread (docs/ordering.md).
        def single_active_consumer(on = nil)
          return setting(:single_active_consumer) if on.nil?

          set(:single_active_consumer, on ? true : false)
        end

        # The queues it consumes: its queue, or its partition queues.
        def consume_queues
          p = partitions
          p ? AMQP.partition_queues(queue_name, p[:count]) : [queue_name]
        end

        # Handler threads per process: one per partition when partitioned.
        def threads = partitions ? partitions[:count] : concurrency

        # Publish to this class's queue through AceMQ::Rails.publisher; to
        # the key's partition when it is partitioned. options as
        # Connection#publish takes them.
        def publish(payload, **options)
          p = partitions
          return AceMQ::Rails.publisher.publish(payload, to: queue_name, **options) unless p

          key = p[:by].call(Outgoing.new(payload, options[:type], options[:headers]))
          if key.nil? || key == ""
            raise AMQP::PartitionKeyMissing, "#{self}: partitions by: returned #{key.inspect} for #{payload.inspect[0, 200]}"
          end

          AceMQ::Rails.publisher.publish(payload, to: queue_name, partition_key: key, partitions: p[:count], **options)
        end

        # Pause when a downstream is down, rather than send valid messages
        # round the retry ladder into the DLQ: `failures` counted failures
        # within `within` seconds pause consumption, giving back what was
        # buffered with no attempt spent; then one message is tried every
        # `probe` seconds (default 5, at most `pause`) until one succeeds.
        # on: says which failures count (exception classes, matched with
        # is_a?; callables taking the error; :retry, :timeout) and ignore:
        # which never do; without either every raise, retry and timeout
        # counts. Failures that do not count take the ladder (docs/flow.md).
        #
        #   circuit_breaker failures: 10, within: 30, pause: 60, on: [Net::ReadTimeout, Errno::ECONNREFUSED]
        def circuit_breaker(failures: nil, within: nil, pause: nil, probe: nil, on: nil, ignore: nil)
          given = { failures: failures, within: within, pause: pause, probe: probe, on: on, ignore: ignore }.compact
          return setting(:circuit_breaker) if given.empty?

          # Checked as given, by core's rules (BreakerOptions asks core).
          breaker = ruled { AMQP::BreakerOptions.new(failures: failures, within: within, pause: pause, probe: probe, on: on, ignore: ignore) }
          set(:circuit_breaker, breaker.to_h)
        end

        # At most `limit` messages per `per` seconds, in each process
        # (docs/flow.md): `throttle 100, per: 1`. With store: (a SQL
        # connection as SQL.connect takes it; under --processes one opened in
        # each process, e.g. `store: AceMQ::AMQP::SQL.per_thread { PG.connect(url) }`
        # or `store: -> { ActiveRecord::Base.connection }`), across every
        # process sharing it.
        def throttle(limit = nil, per: 1, store: nil)
          return setting(:throttle) if limit.nil?

          # Checked as given, by core's rules (as consume checks it).
          limit, per = ruled { AMQP::Connection.throttle({ limit: limit, per: per }) }
          settings = { limit: limit, per: per }
          settings[:store] = store if store
          set(:throttle, settings)
        end

        # Bind the queue to an exchange, declared at boot with it:
        #
        #   bind "orders-events", routing_key: "order.*"             # a topic exchange
        #   bind "audit", type: :fanout
        #   bind "orders-events", routing_key: %w[order.placed order.paid]
        #
        # The exchange is declared too (durable, `type:`, default :topic),
        # so every process that binds to it can be the first to boot.
        def bind(exchange, routing_key: "", type: :topic)
          exchange = exchange.to_s
          raise AMQP::ConfigurationError, "#{self}: bind needs an exchange name" if exchange.empty?

          keys = Array(routing_key).map(&:to_s)
          keys = [""] if keys.empty?
          set(:bindings, (bindings + keys.map { |k| [exchange, type.to_s, k].freeze }).uniq.freeze)
        end

        def bindings = setting(:bindings)

        # What to do with the errors a consumer meets outside the handler (a
        # retry copy the broker refused, a lost channel): a callable taking
        # the error, or a block. Default: the runner's logger at warn.
        def on_error(callable = nil, &block)
          handler = callable || block
          return setting(:on_error) unless handler
          raise AMQP::ConfigurationError, "#{self}: on_error needs a callable or a block" unless handler.respond_to?(:call)

          set(:on_error, handler)
        end

        # Guard #call with the idempotent consumer, the same mechanism as
        # Patterns.idempotent: `idempotent store: STORE, key: ->(m) { ... }`.
        # Without it, wrap by hand inside #call as the guide shows.
        def idempotent(store:, key: nil)
          # Built now so a store that is not one fails the class, not a message.
          AMQP::Patterns.with_idempotency(store, key: key)
          set(:idempotency, { store: store, key: key }.freeze)
        end

        def idempotency = setting(:idempotency)
        def queue_arguments = setting(:queue_arguments)

        # Exchanges, the queue (with its .dlq) and bindings, for apply.
        def topology
          raise AMQP::ConfigurationError, "#{self} has no queue: add `queue \"name\"` to the class" unless queue_name

          t = AMQP::Topology.new
          if partitions
            raise AMQP::ConfigurationError, "#{self}: a partitioned queue takes no bindings: publish with #{self}.publish" unless bindings.empty?

            args = (queue_arguments || {}).merge("x-single-active-consumer" => true)
            consume_queues.each { |q| t.queue(q, arguments: args, type: queue_type) }
            return t
          end
          bindings.map { |e, type, _| [e, type] }.uniq.each { |e, type| t.exchange(e, type: type) }
          arguments = single_active_consumer ? (queue_arguments || {}).merge("x-single-active-consumer" => true) : queue_arguments
          t.queue(queue_name, arguments: arguments, type: queue_type)
          bindings.each { |e, _, key| t.bind(queue_name, to: e, routing_key: key) }
          t
        end

        # What the subscription calls for `instance`: the instance itself, or
        # the idempotency guard around it when the class declares one (a
        # Patterns.idempotent Proc, which answers call_many for batch).
        def pipeline(instance)
          guard = idempotency
          handler = if guard
                      # A partition or single active consumer: a message whose
                      # key a dead or slow runner still claims waits in place
                      # rather than round the ladder (docs/ordering.md).
                      AMQP::Patterns.idempotent(guard[:store], key: guard[:key],
                                                               keep_order: !partitions.nil? || single_active_consumer) do |m|
                        Replying.to(m) { instance.call(m) }
                      end
                    else
                      instance.respond_to?(:call_many) ? instance : Replying.wrap(instance)
                    end
          if batch > 1 && !handler.respond_to?(:call_many)
            raise AMQP::ConfigurationError,
                  "#{self}: batch #{batch} needs the idempotent macro (a batch is claimed and confirmed by the guard); " \
                  "remove batch or add `idempotent store: ...`"
          end
          handler
        end

        # Subscribe `instance` on connection. around: wraps every call (the
        # runner passes the Rails executor); on_error: is the fallback when
        # the class declares none.
        # queue: one of consume_queues (default the first: the queue itself).
        def subscribe(connection, instance: new, around: nil, on_error: nil, consumer_timeout: nil, queue: consume_queues.first)
          handler = Around.wrap(pipeline(instance), around, report: ErrorReport.new(self))
          # One handler at a time per partition: the order is the queue's.
          connection.consume(queue, concurrency: partitions ? 1 : concurrency, prefetch: prefetch, retries: retries,
                                         batch: batch, queue_type: queue_type, on_error: self.on_error || on_error,
                                         timeout: timeout, consumer_timeout: consumer_timeout, name: name,
                                         circuit_breaker: circuit_breaker, throttle: throttle,
                                         keep_order: !partitions.nil? || single_active_consumer, &handler)
        end

        # Settings as a Hash, for logs and the health endpoint.
        def describe
          { name: name, queue: queue_name, concurrency: concurrency, prefetch: prefetch, batch: batch, timeout: timeout,
            bindings: bindings.map { |e, _, k| "#{e}/#{k}" }, idempotent: !idempotency.nil?,
            partitions: partitions&.fetch(:count) }
        end

        private

        def settings = (@settings ||= {})

        def set(key, value)
          settings[key] = value
        end

        def setting(key)
          klass = self
          while klass <= Consumer
            s = klass.instance_variable_get(:@settings)
            return s[key] if s&.key?(key)

            klass = klass.superclass
          end
          SETTINGS.fetch(key)
        end

        def positive_seconds(name, value)
          n = begin
            Float(value)
          rescue ArgumentError, TypeError
            raise AMQP::ConfigurationError, "#{self}: #{name} is a number of seconds, got #{value.inspect}"
          end
          raise AMQP::ConfigurationError, "#{self}: #{name} must be longer than zero seconds (got #{n})" unless n.positive?

          n
        end

        # concurrency, prefetch or batch, checked by the engine's rules
        # (the ones consume applies) as the class is defined.
        def size(name, value)
          n = whole(name, value)
          begin
            AMQP._check_sizes(name == :concurrency ? n : 1, name == :prefetch ? n : nil, name == :batch ? n : 1)
          rescue AMQP::ConfigurationError => e
            raise AMQP::ConfigurationError, "#{self}: #{e.message}"
          end
          n
        end

        def whole(name, value)
          Integer(value)
        rescue ArgumentError, TypeError
          raise AMQP::ConfigurationError, "#{self}: #{name} must be a whole number, got #{value.inspect}"
        end

        # The block's ConfigurationError (core's rule, said by the
        # extension) with this class's name in front.
        def ruled
          yield
        rescue AMQP::ConfigurationError => e
          raise AMQP::ConfigurationError, "#{self}: #{e.message}"
        end

        def current?(klass)
          klass.name && Object.const_defined?(klass.name) && Object.const_get(klass.name).equal?(klass)
        rescue NameError
          false
        end
      end

      # Handle one message and return an Ack: accept, reject(reason) or
      # retry_later(reason). Raising is a retry; raising
      # AceMQ::AMQP::FatalError is a reject.
      def call(message)
        raise NotImplementedError, "#{self.class} must define call(message) and return accept, reject or retry_later"
      end

      def inspect = "#<#{self.class.name || 'AceMQ::Rails::Consumer'} queue=#{self.class.queue_name.inspect}>"

      private

      # Handled: the message is gone.
      def accept = AMQP::Ack.accept

      # Never: to {queue}.dlq at once, with the reason.
      def reject(reason = "rejected", error: nil) = AMQP::Ack.reject(reason, error: error)

      # Not now: to the next rung of the ladder, back after its delay, and to
      # the DLQ once max_attempts is used up. Not called `retry`: that is a
      # Ruby keyword, and a bare `retry(...)` outside a rescue does not parse.
      def retry_later(reason = "retry requested", error: nil) = AMQP::Ack.retry(reason, error: error)

      # Publish from a handler on the runner's publishing connection (its own
      # connection, so a broker that blocks publishers under an alarm does
      # not stop this consumer from draining). Outside a runner: the
      # connection AceMQ::Rails.publisher opens.
      def publish(payload, to:, **options) = AceMQ::Rails.publisher.publish(payload, to: to, **options)

      # Answer the request being handled (one sent with Connection#request):
      # payload to its reply_to with its correlation_id, on the same
      # connection as publish. to: names the request when the consumer is
      # called directly (a spec). A reply is at most once: a requester that
      # has given up never sees it (docs/request-reply.md).
      def reply(payload, to: Replying.current, **options)
        raise AMQP::ConfigurationError, "reply needs the request: call it from call(message), or pass to: message" unless to

        AceMQ::Rails.publisher.reply(to, payload, **options)
      end

      def logger = AceMQ::Rails.logger
    end
  end
end

require "acemq/rails/around"
require "acemq/rails/replying"
require "acemq/rails/error_report"
