# frozen_string_literal: true

module AceMQ
  module AMQP
    # A connection to RabbitMQ (amqp://) or to the in-process broker
    # (memory://). Thread-safe: one per process is the usual shape, shared by
    # every publisher and consumer in it.
    class Connection
      # Open a connection. A broker that is down raises ConnectionFailed after
      # connect_timeout seconds rather than hanging the boot.
      # connect_timeout: and confirm_timeout: are core's defaults when left
      # out (ConnectionOptions::default()). heartbeat: is the AMQP
      # heartbeat in seconds (default: the broker's, 60 s on RabbitMQ); it is
      # sent by the engine's I/O thread, so a long handler does not stop it.
      #
      # Several URLs (the nodes of a cluster) are tried in order; when the
      # connection is lost, the next one is dialled first.
      #
      # amqps:// is TLS (port 5671 unless the URL says), verified against the
      # system's CA store unless tls: says otherwise:
      #
      #   Connection.open("amqps://user:pass@mq.internal/prod",
      #                   tls: { ca_file: "ca.pem", cert_file: "client.pem", key_file: "client.key" })
      #
      # tls: keys are ca_file: (the CAs to trust instead of the system's),
      # cert_file: and key_file: (a client certificate, for a broker that
      # requires one), server_name: (the name the broker's certificate must
      # carry, when it is not the URL's host) and verify: (default true;
      # false accepts any certificate, for tests only). The files are read
      # once, here. A TLS failure raises TLSError, a ConnectionFailed.
      def self.open(url = ENV.fetch("AMQP_URL", "memory://"), origin: nil, connect_timeout: nil, confirm_timeout: nil,
                    heartbeat: nil, tls: nil)
        urls = url.is_a?(Array) ? url : [url]
        unless !urls.empty? && urls.all?(String)
          raise ConfigurationError, "Connection.open needs a URL string or an Array of them, got #{url.inspect}"
        end

        _open(urls, { origin: origin&.to_s, connect_timeout: connect_timeout && Float(connect_timeout),
                      confirm_timeout: confirm_timeout && Float(confirm_timeout), heartbeat: heartbeat && Float(heartbeat),
                      tls: tls_settings(tls) })
      end

      TLS_PATHS = %i[ca_file cert_file key_file].freeze
      TLS_KEYS = [*TLS_PATHS, :verify, :server_name].freeze
      private_constant :TLS_PATHS, :TLS_KEYS

      # tls: as the engine reads it: Symbol keys (String ones are accepted,
      # as a YAML file gives them), String paths (a Pathname is fine), and
      # a verify that is true or false rather than merely truthy.
      def self.tls_settings(tls)
        return nil if tls.nil?
        raise ConfigurationError, "tls: must be a Hash (ca_file:, cert_file:, key_file:, verify:), got #{tls.inspect}" unless tls.is_a?(Hash)

        settings = tls.to_h { |k, v| [k.to_sym, v] }
        unknown = settings.keys - TLS_KEYS
        unless unknown.empty?
          raise ConfigurationError, "unknown tls: #{unknown.map(&:inspect).join(', ')}: use #{TLS_KEYS.join(', ')}"
        end
        TLS_PATHS.each { |k| settings[k] = settings[k].to_s if settings.key?(k) && !settings[k].nil? }
        settings[:server_name] = settings[:server_name].to_s unless settings[:server_name].nil?
        unless [true, false, nil].include?(settings[:verify])
          raise ConfigurationError, "tls: { verify: } must be true or false, got #{settings[:verify].inspect}"
        end

        settings
      end
      private_class_method :tls_settings

      # Publish payload as JSON and return once the broker has confirmed it.
      #
      # to: is the queue name (through the default exchange) or, with
      # exchange:, the routing key. An envelope: keeps its id, so publishing
      # one envelope twice is one message id twice. type: and headers: go
      # over the envelope's. Returns the Envelope the message went out with
      # (the engine's: this connection's origin where the envelope had none,
      # attempt 1), which is not the one passed in.
      #
      # Raises Unroutable when nothing is bound to take it (it was not
      # stored), NotFound for a missing exchange, PublishNacked when the
      # broker refuses it.
      #
      # With OpenTelemetry loaded, the publish is a producer span and the
      # message carries its context (traceparent) unless headers: or the
      # envelope already has one (docs/tracing.md).
      #
      # delay: (seconds) or at: (a Time) delivers it later, through the delay
      # cascade (docs/delays.md): whole seconds, rounded up, up to 2^28 - 1 s.
      # The envelope returned is the one delivered then.
      #
      # partition_key: with partitions: (the count the queue's consumers
      # declared) sends it to the partition queue of `to` that the key hashes
      # to (`to.pN`, docs/ordering.md): messages with one key are handled in
      # the order they were published.
      def publish(payload, to:, exchange: "", envelope: nil, type: nil, headers: nil, delay: nil, at: nil,
                  partition_key: nil, partitions: nil)
        Tracing.publish(exchange, to) do |span|
          out, env = outgoing(payload, to, exchange, envelope, type, headers, delay: delay, at: at,
                                                                              partition: Connection.partition(partition_key, partitions))
          span&.set_attribute("messaging.message.id", env.id.to_s)
          _publish(out)
          env
        end
      end

      # Send payload to `to` as a request and wait for the reply, which is
      # returned as a Message (the replier's envelope; its
      # delivery.properties.correlation_id is the request's). Over RabbitMQ's
      # direct reply-to: no queue per request; any number of threads may
      # have requests in flight on one connection (docs/request-reply.md).
      #
      # Raises TimeoutError when no reply comes within timeout: seconds (the
      # request may still be handled; a reply after that is dropped and
      # counted in #late_replies), RemoteError when the responder's handler
      # failed on it, and what publish raises when the request cannot be
      # sent (Unroutable for a queue nobody declared).
      #
      # The request carries its deadline (now + timeout): a consumer that
      # meets it later drops it unhandled. retry_safe: true says handling it
      # more than once does no harm: a failure then goes round the
      # consumer's retry ladder before the error reply, which comes once the
      # retries are spent or the next one would come back too late.
      def request(payload, to:, timeout: 5, exchange: "", envelope: nil, type: nil, headers: nil, retry_safe: false)
        seconds = begin
          Float(timeout)
        rescue ArgumentError, TypeError
          nil
        end
        # Only the timeout's own conversion is rescued: a ConfigurationError
        # (an ArgumentError) from building the message must keep its message.
        unless seconds&.finite? && seconds.positive?
          raise ConfigurationError, "timeout: must be a number of seconds above 0, got #{timeout.inspect}"
        end
        raise ConfigurationError, "retry_safe: must be true or false, got #{retry_safe.inspect}" unless [true, false].include?(retry_safe)

        Tracing.publish(exchange, to) do |span|
          out, env = outgoing(payload, to, exchange, envelope, type, headers)
          span&.set_attribute("messaging.message.id", env.id.to_s)
          _request(out, seconds, retry_safe)
        end
      rescue RemoteError => e
        # The responder's frames first, where the failure happened, then
        # this side's, down to the request.
        e.set_backtrace(e.remote_backtrace + (e.backtrace || caller))
        raise e
      end

      # Answer `request` (a Message that came from #request): payload to its
      # reply_to, with its correlation_id and an envelope of its own; returns
      # that Envelope. A requester that has gone away is not an error: the
      # reply is dropped, as RabbitMQ drops it.
      def reply(request, payload, type: nil, headers: nil)
        props = request.respond_to?(:delivery) ? request.delivery&.properties : nil
        unless props&.reply_to
          raise ConfigurationError, "reply needs a message sent with request (it has no reply_to): a published " \
                                    "message has nobody to answer"
        end

        out, env = outgoing(payload, props.reply_to, "", nil, type, headers)
        _reply(out, props.reply_to, props.correlation_id)
        env
      end

      # late_replies (native): replies that came after their request had
      # timed out, and were dropped.

      # Publish many and wait for their confirms together:
      #
      #   mq.batch { |b| orders.each { |o| b.publish(o, to: "orders") } }
      #
      # Returns how many were published. Nothing is sent until the block
      # returns, so a block that raises publishes nothing. stream: true sends
      # each message while the block builds the next (Batch): faster, and a
      # long batch is not held in memory, but a block that raises has sent
      # what it published before the raise.
      def batch(stream: false)
        batch = Batch.new(self, _batch(stream), stream: stream)
        begin
          yield batch
        rescue StandardError
          batch.abandon
          raise
        end
        batch.flush
      end

      # Run the block for every message on queue, on `concurrency` Ruby
      # threads, until the returned Subscription is cancelled. The block
      # returns an Ack.
      #
      # retries: { max_attempts:, initial_delay:, max_delay: } (seconds) sets
      # the retry ladder; the default is core's RetryPolicy::default().
      # prefetch: defaults to core's (ConsumeOptions::with_batches: twice
      # concurrency times batch, with a floor) and is never unlimited.
      # batch: lets a handler that answers call_many (Patterns.idempotent)
      # take up to that many buffered deliveries at once — one claim and one
      # confirm transaction for all of them instead of one each.
      #
      # queue_type: (:classic or :quorum) is the type of the queue, which its
      # DLQ and rungs take; by default what this connection applied for the
      # queue in a Topology, else classic.
      #
      # timeout: (seconds) is the handler deadline: a delivery whose handler
      # has not returned by then is settled as a retry by the engine, and
      # what the handler returns later is discarded; the handler itself is
      # not interrupted (its thread is replaced, see Subscription#overdue).
      # By default core's DEFAULT_TIMEOUT, or an idempotent handler's
      # claim_timeout when that is shorter; it must be shorter than the
      # broker's consumer_timeout: (core's DEFAULT_BROKER_CONSUMER_TIMEOUT,
      # RabbitMQ's default, unless given).
      #
      # name: is the consumer's name in events and metrics (the queue's by
      # default; a Rails consumer passes its class name).
      #
      # circuit_breaker: { failures: 10, within: 30, pause: 60 } pauses the
      # subscription when that many failures are counted within `within`
      # seconds: what it had buffered goes back to the queue with no attempt
      # spent, and every `probe` seconds (default 5, at most `pause`) one
      # message is tried until one succeeds. on: (exception classes, matched
      # with is_a?; callables taking the error; :retry for Ack.retry;
      # :timeout for a handler past its deadline) counts only those;
      # ignore: (the same) never counts them. Without either every raise,
      # retry and timeout counts; rejects never do (BreakerOptions,
      # docs/flow.md). A failure that does not count takes the ladder.
      # throttle: { limit: 100, per: 1 } hands out at most `limit` messages
      # per `per` seconds in this process (docs/flow.md); with store: (a SQL
      # connection, as SQL.connect takes: its own, or SQL.per_thread { ... })
      # at most `limit` per window across every process whose consumer of the
      # same name shares the store.
      # keep_order: true for a single-active-consumer queue whose order
      # matters (a partition): stopping leaves the broker's consumer in place
      # until the close gives back what it held, in order (docs/ordering.md);
      # and a Patterns.idempotent handler holds a message whose key another
      # worker claims in place rather than send it round the ladder.
      def consume(queue, concurrency: CONSUME_DEFAULTS.fetch(:concurrency), prefetch: nil, retries: nil, on_error: nil, batch: 1, queue_type: nil,
                  timeout: nil, consumer_timeout: nil, name: nil, circuit_breaker: nil, throttle: nil, keep_order: false,
                  &handler)
        raise ConfigurationError, "consume needs a block (the handler)" unless handler

        concurrency = Connection.count(:concurrency, concurrency)
        prefetch = Connection.count(:prefetch, prefetch)
        batch = Connection.count(:batch, batch)
        # The engine's rules (at least 1 each, prefetch at most 65535), here
        # where they were given.
        AMQP._check_sizes(concurrency, prefetch, batch)

        policy = RetryPolicy.from(retries)
        handler.guard.keep_order! if keep_order && handler.respond_to?(:guard) && handler.guard.respond_to?(:keep_order!)
        claim_timeout = handler.respond_to?(:claim_timeout) ? handler.claim_timeout : nil
        # Only a handler answering call_many is given batches; the engine's
        # default prefetch is two batches per handler thread.
        native = _consumer(Connection.text(:queue, queue.to_s), { prefetch: prefetch, concurrency: concurrency,
                                         batch: handler.respond_to?(:call_many) ? batch : 1,
                                         max_attempts: policy.max_attempts,
                                         initial_delay: policy.initial_delay, max_delay: policy.max_delay,
                                         queue_type: queue_type&.to_s, timeout: timeout && Float(timeout),
                                         consumer_timeout: consumer_timeout && Float(consumer_timeout),
                                         claim_timeout: claim_timeout, name: name&.to_s,
                                         circuit_breaker: (breaker = BreakerOptions.from(circuit_breaker))&.native,
                                         throttle: Connection.throttle(throttle), keep_order: keep_order ? true : false,
                                         throttle_store: throttle_store = Connection.throttle_store(throttle) })
        # The engine calls the adapter while the subscription lives.
        native.instance_variable_set(:@throttle_store, throttle_store) if throttle_store
        on_error ||= ->(error) { warn("acemq: #{queue}: #{error.message}") }
        Subscription.new(native, handler, concurrency: concurrency, on_error: on_error, batch: batch, breaker: breaker)
      end

      # [key, count] as the engine takes it, or nil.
      # The key is a String, Symbol or Integer, never empty: their text is
      # stable, where another object's to_s (`#<Object:0x…>`) would send one
      # key to a different partition each time, and "" is no key at all
      # (as the idempotent consumer reads it). The count is an Integer in
      # the engine's range, never a Float truncated (8.9 went to 8) nor a
      # RangeError from the conversion (-1, 2**70).
      def self.partition(key, count)
        return nil if key.nil? && count.nil?
        raise ConfigurationError, "partitions: is missing: give the count the consumers declared with partition_key:" if count.nil?
        raise PartitionKeyMissing, "partition_key: is nil: give the message's key (an order's id, an account)" if key.nil?
        unless key.is_a?(String) || key.is_a?(Symbol) || key.is_a?(Integer)
          raise ConfigurationError, "partition_key: must be a String, Symbol or Integer (got a #{key.class}): its text picks the partition"
        end

        text = text(:partition_key, key.to_s)
        raise PartitionKeyMissing, "partition_key: is empty: give the message's key (an order's id, an account)" if text.empty?

        [text, partition_count(count)]
      end

      # A partition count as given (publish's partitions:, a consumer
      # class's partitions): a whole number, for core to check (1 to
      # acemq::partition::MAX_PARTITIONS) where it is used, as it was given.
      def self.partition_count(count)
        n = count.is_a?(Float) || count.is_a?(Rational) ? nil : Integer(count, exception: false)
        return n if n&.between?(-2**62, 2**62)

        raise ConfigurationError, "partitions: must be a whole number, the count the consumers declared (got #{count.inspect})"
      end

      # { limit:, per: } as the engine takes it.
      def self.throttle(options)
        return nil if options.nil?

        o = options.is_a?(Hash) ? options.transform_keys(&:to_sym) : {}
        unless o.key?(:limit) && (o.keys - %i[limit per store]).empty?
          raise ConfigurationError, "throttle takes limit:, per: (seconds, default 1) and store: (a SQL connection shared " \
                                    "across processes, optional), e.g. { limit: 100, per: 1 } " \
                                    "(got #{options.inspect})"
        end
        limit = o[:limit].is_a?(Float) ? nil : Integer(o[:limit], exception: false)
        per = Float(o.fetch(:per, 1), exception: false)
        if limit.nil? || per.nil? || !limit.between?(-2**62, 2**62)
          raise ConfigurationError, "throttle: limit is a whole number of messages, per seconds (got #{options.inspect})"
        end

        # Core's rules (a limit of at least 1, a positive period), here where
        # they were given.
        AMQP._check_throttle(limit, per)
        [limit, per]
      end

      # The SQL adapter of a throttle's store:, or nil.
      def self.throttle_store(options)
        store = options.is_a?(Hash) ? options.transform_keys(&:to_sym)[:store] : nil
        store && SQL.connect(store)
      end

      # Declare topology's exchanges, queues (each with its DLQ) and
      # bindings: Topology#apply, said from this side, as Rust's
      # Connection::apply says it.
      def apply(topology)
        raise ConfigurationError, "apply takes an AceMQ::AMQP::Topology, got #{topology.class}" unless topology.is_a?(Topology)

        _apply(topology)
        self
      end

      # Delete topology's queues with their rungs and DLQs (Topology#teardown
      # has the rules); the names deleted.
      def teardown(topology, retries: nil, force: false)
        raise ConfigurationError, "teardown takes an AceMQ::AMQP::Topology, got #{topology.class}" unless topology.is_a?(Topology)

        ladders = (retries.is_a?(Array) ? retries : [retries].compact).map { |r| RetryPolicy.from(r) }
        _teardown(topology.queues.map(&:name), ladders, force ? true : false)
      end

      # Move dead letters from {queue}.dlq back to queue, with the attempt
      # count reset and the failure kept in x-acemq-history. All of them, or
      # at most limit:, optionally only those whose reason contains reason:
      # or whose type is type:. A message leaves the DLQ only once its copy
      # is confirmed. Returns a DeadLetters::ReplayReport (report.replayed,
      # report.skipped).
      # error_class: and ids: narrow it further (the class exactly; the
      # message ids, any of them).
      def replay_dead_letters(queue, limit: nil, reason: nil, type: nil, error_class: nil, ids: nil)
        report = _replay(Connection.text(:queue, queue.to_s), limit: Connection.count(:limit, limit),
                         reason: reason&.to_s, type: type&.to_s, error_class: error_class&.to_s,
                         ids: Array(ids).map(&:to_s))
        DeadLetters::ReplayReport.new(replayed: report.moved, skipped: report.skipped)
      end

      # Remove dead letters from {queue}.dlq for good: those whose id is in
      # ids:, or all matching reason:/type:/error_class:. Read as a replay
      # reads them; the rest stay in order. With neither ids nor a filter it
      # refuses: purge_dead_letters says "all" out loud.
      # Returns a DeadLetters::DiscardReport (report.discarded,
      # report.skipped).
      def discard_dead_letters(queue, ids: nil, reason: nil, type: nil, error_class: nil)
        ids = Array(ids).map(&:to_s)
        if ids.empty? && [reason, type, error_class].all?(&:nil?)
          raise ConfigurationError, "discard needs ids: or a filter (reason:, type:, error_class:); purge_dead_letters removes them all"
        end

        report = _replay(Connection.text(:queue, queue.to_s), reason: reason&.to_s, type: type&.to_s,
                         error_class: error_class&.to_s, ids: ids, discard: true)
        DeadLetters::DiscardReport.new(discarded: report.moved, skipped: report.skipped)
      end

      # What waits in the delay cascade (docs/delays.md): a Delays::Level per
      # level that holds anything, level 0 first: level, queue, seconds
      # (what the level holds a message for), waiting. On RabbitMQ the level queues'
      # ready counts (a passive declare each); on memory:// each delayed
      # message counted in the level it would be in now. What `acemq status`
      # and the web dashboard show.
      def delayed
        _delayed_waiting.filter_map do |l|
          Delays::Level.new(level: l.level, queue: l.queue, seconds: l.seconds, waiting: l.waiting) if l.waiting.positive?
        end.freeze
      end

      # Every dead letter in {queue}.dlq removed. Returns a
      # DeadLetters::PurgeReport (report.discarded).
      def purge_dead_letters(queue)
        DeadLetters::PurgeReport.new(discarded: _replay(Connection.text(:queue, queue.to_s), discard: true).moved)
      end

      # Up to limit: dead letters in {queue}.dlq, oldest first, left where
      # they are: an Array of DeadLetters::Letter, each with id, type,
      # attempt, reason, error_class, backtrace (x-acemq-backtrace: where the
      # error was raised, its first frames one a line; nil when it had
      # none), failed_at (a Time), body (the bytes as they arrived),
      # exchange and routing_key (where it was first published), headers
      # and history (x-acemq-history: earlier failures, oldest first).
      def peek_dead_letters(queue, limit: 10)
        browse_dead_letters(queue, limit: limit).dead_letters
      end

      # One page of {queue}.dlq, left where it is: the dead letters matching
      # reason: (contained), type:, error_class: and ids:, after the first
      # skip: matches, at most limit:. Returns a DeadLetters::Page:
      # dead_letters (Letters, as peek_dead_letters), scanned (messages
      # read: what the page cost), more (another match follows), moved (put
      # back at the tail as fresh copies, near a delivery limit: the DLQ's
      # order changed), partial (the read stopped before the end of a DLQ
      # deeper than 1,000; on a broker that puts returned messages at the
      # tail, RabbitMQ 3.10's quorum queues, the DLQ has rotated by
      # scanned), total (what the DLQ held when the read began), gave_up
      # (it stopped at within: seconds), most_held (the most held
      # unacknowledged at once, at most 1,000).
      # One reader at a time per DLQ, across processes: a second waits up to
      # 2 s, then raises BrokerError with reply_code 405 (docs/web.md).
      def browse_dead_letters(queue, limit: 25, skip: 0, reason: nil, type: nil, error_class: nil, ids: nil,
                              within: nil)
        page, total, gave_up, most_held = _browse(Connection.text(:queue, queue.to_s), skip: Connection.count(:skip, skip),
                                                  limit: Connection.count(:limit, limit), reason: reason&.to_s,
                                                  type: type&.to_s, error_class: error_class&.to_s,
                                                  ids: Array(ids).map(&:to_s), within: within&.then { |w| Float(w) })
        DeadLetters::Page.new(dead_letters: page.letters.map { |d| DeadLetters::Letter.from(d) }, scanned: page.scanned,
                              more: page.more?, moved: page.moved, partial: page.partial?, total: total,
                              gave_up: gave_up, most_held: most_held)
      end

      # memory:// only: move the broker's clock forward, so messages waiting
      # in a rung of the retry ladder come back now.
      def advance_clock(seconds)
        _advance_clock(Float(seconds))
        self
      end

      # memory:// only: empty the process's memory broker of every queue,
      # exchange and message (true; false on RabbitMQ, which it leaves alone).
      # The broker outlives its connections, so the testing kit's Harness
      # calls this when a test ends. Not for applications: undocumented.
      def reset_memory = _reset_memory

      # memory:// only: { ready:, unacked: } for a queue, nil if it does not exist.
      def queue_depth(queue)
        raise ConfigurationError, "queue_depth works on memory:// connections only" unless memory?

        ready, unacked = _queue_depth(queue.to_s)
        ready && { ready: ready, unacked: unacked }
      end

      # { ready:, consumers: } for a queue, by a passive declare (nothing is
      # created), or nil when it does not exist. Works on RabbitMQ and
      # memory://. AMQP has no count of unacknowledged messages: see
      # docs/observability.md for where `acemq status` gets them.
      def queue_counts(queue)
        ready, consumers = _queue_counts(Connection.text(:queue, queue.to_s))
        ready && { ready: ready, consumers: consumers }
      end

      # queue_counts of each name, asked on one channel: { name => counts or nil }.
      def queue_counts_many(queues)
        names = queues.map { |q| Connection.text(:queue, q.to_s) }
        names.zip(_queue_counts_many(names)).to_h { |n, (ready, consumers)| [n, ready && { ready: ready, consumers: consumers }] }
      end

      # server_version (native): the broker's version as its connection.start
      # said ("4.3.6"), nil on memory://. RabbitMQ's delivery limits, what
      # counts toward them and where consumer_timeout applies differ by
      # version (docs/production.md); the engine's checks read it.

      # What the connection holds now: channels (the channel ids held on the
      # current AMQP connection; 0 on memory://, which has none) and tasks
      # (alive on the engine's runtime). After any number of failed
      # operations both stay where they were: `rake soak` checks it.
      Resources = Struct.new(:channels, :tasks, keyword_init: true)

      def resources = Resources.new(**_resources)

      def inspect = "#<AceMQ::AMQP::Connection origin=#{origin.inspect}#{closed? ? ' closed' : ''}>"

      private

      # The message as it will be sent, and its Envelope: built once by the
      # engine (Outgoing), whose envelope_for holds every rule (a fresh
      # envelope unless one is given, type and headers over it, the trace
      # context unless one is there, this connection's origin, attempt 1).
      # What was left out goes as nil. publish and Patterns.record (an
      # outbox row) come through here, and a batch through #publish_options and its
      # engine's _push, which reads them the same way, so they all carry the
      # same.
      def outgoing(payload, to, exchange, envelope, type, headers, delay: nil, at: nil, partition: nil)
        options = publish_options(to, exchange, envelope, type, headers, delay: delay, at: at)
        options[:partition] = partition if partition
        out = Outgoing._build(self, encode(payload), options)
        [out, out.envelope]
      end

      # The options by name, as the engine reads them (Outgoing._build and a
      # batch's _push).
      def publish_options(to, exchange, envelope, type, headers, delay: nil, at: nil)
        raise ConfigurationError, "envelope: must be an AceMQ::AMQP::Envelope" if envelope && !envelope.is_a?(Envelope)
        unless headers.nil? || headers.is_a?(Hash)
          raise ConfigurationError, "headers: must be a Hash of names to values, got #{headers.class}"
        end

        options = { exchange: Connection.text(:exchange, exchange.to_s), to: Connection.text(:to, to.to_s), envelope: envelope,
                    type: type && Connection.text(:type, type.to_s), headers: headers, trace: Tracing.context }
        delay.nil? && at.nil? ? options : options.merge(Connection.when_due(delay, at))
      end

      # A name the broker reads as UTF-8 (a queue, an exchange, a routing
      # key, a type): a String in another encoding is converted, and one
      # whose bytes are not text is refused here, saying so, rather than as
      # Ruby's own ::EncodingError from deep inside the conversion.
      def self.text(name, value, why: "RabbitMQ reads names as UTF-8")
        return value if value.encoding == Encoding::UTF_8 && value.valid_encoding?

        utf8 = value.dup.force_encoding(Encoding::UTF_8)
        return utf8 if utf8.valid_encoding? && (value.encoding == Encoding::BINARY || value.ascii_only?)

        converted = value.encode(Encoding::UTF_8)
        raise ::EncodingError unless converted.valid_encoding?

        converted
      rescue ::EncodingError
        raise ConfigurationError, "#{name}: must be UTF-8 text (#{why}), got bytes that are not: " \
                                  "#{value.b.inspect[0, 80]}"
      end

      # Headers as JSON, which the engine reads into an AMQP table: what
      # Ruby's JSON would refuse or write wrongly (bytes that are not UTF-8,
      # NaN, an object with no JSON form, an Integer past AMQP's 64 bits,
      # nesting past JSON's limit) is refused here, saying what to send.
      def self.header_json(headers, what)
        json = JSON.generate(headers)
        bad = (json.include?('"#<') && without_json_form(headers)) || too_wide(headers)
        if bad
          raise EncodingError, "#{what}: a #{bad.class} (#{bad.inspect[0, 40]}) cannot be a header value: " \
                               "#{bad.is_a?(Integer) ? 'AMQP integers are 64-bit; send it as a String' : 'convert it first (to_s, to_h)'}"
        end
        json
      rescue JSON::JSONError, TypeError, ArgumentError, ::EncodingError => e
        raise EncodingError, "#{what} cannot be sent (#{e.message.to_s[0, 120]}): header values must be UTF-8 Strings, " \
                             "numbers, true, false, nil, or Arrays and Hashes of them"
      end

      # The first Integer in value past a signed 64-bit field, or nil.
      def self.too_wide(value)
        case value
        when Hash then value.each_value { |v| (bad = too_wide(v)) and return bad } && nil
        when Array then value.each { |v| (bad = too_wide(v)) and return bad } && nil
        when Integer then value.between?(-2**63, 2**63 - 1) ? nil : value
        end
      end

      # delay: and at: as the engine reads them (seconds, and seconds since
      # the epoch); its limits (at most 2^28 - 1 s, not both) are core's.
      def self.when_due(delay, at)
        unless delay.nil? || (delay.is_a?(Numeric) && delay.real? && delay.to_f.finite? && delay >= 0)
          raise ConfigurationError, "delay: must be a number of seconds, 0 or more, got #{delay.inspect}"
        end
        # Time#to_time comes with the date library, which a plain script may
        # not have loaded: a Time is taken as it is.
        unless at.nil? || at.is_a?(Time) || at.respond_to?(:to_time)
          raise ConfigurationError, "at: must be a Time (or anything with to_time), got #{at.inspect}"
        end

        { delay: delay&.to_f, at: at && (at.is_a?(Time) ? at : at.to_time).to_f }
      end

      # The engine writes JSON.generate's bytes itself for Hashes, Arrays,
      # Strings, numbers, true, false and nil, and leaves anything else (a
      # Time, a subclass, a Symbol value: whatever has a to_json of its own,
      # and whatever JSON.generate refuses) to Connection.generate below.
      def encode(payload) = AMQP._encode(payload)

      # The payload's JSON by JSON.generate, for what the engine does not
      # write itself (it calls this).
      def self.generate(payload)
        json = JSON.generate(payload)
        # An object with no JSON form of its own is generated as its to_s,
        # "#<Object:0x...>": a message nobody can use. Cheap to rule out
        # first; walked only when the text could hold one.
        if json.include?('"#<') && (bad = Connection.without_json_form(payload))
          raise EncodingError, "the payload holds a #{bad.class}, which has no JSON form (it would be sent as " \
                               "#{bad.to_s[0, 40].inspect}): convert it first (to_h, as_json, to_s)"
        end
        json
      rescue JSON::JSONError, TypeError, ArgumentError => e
        raise EncodingError, "the payload cannot be sent as JSON (#{e.message}): publish a Hash, Array, String, " \
                             "number, true, false or nil"
      end
      private_class_method :generate

      # A count for the engine, which checks it (at least 1): nil stays nil,
      # and a negative one, which cannot cross into its unsigned field, goes
      # as 0 to get the engine's own refusal.
      def self.count(name, value)
        value.nil? ? nil : Integer(value).clamp(0, 2**62)
      rescue ArgumentError, TypeError
        raise ConfigurationError, "#{name}: must be a whole number, got #{value.inspect}"
      end

      # The first value in payload that JSON would write as its to_s, or nil.
      def self.without_json_form(value)
        case value
        when Hash then value.each { |k, v| (bad = without_json_form(k) || without_json_form(v)) and return bad } && nil
        when Array then value.each { |v| (bad = without_json_form(v)) and return bad } && nil
        when String, Symbol, Integer, Float, true, false, nil then nil
        # Written as its to_s whatever defines to_json (json's own fallback,
        # or ActiveSupport's, which defers to it inside JSON.generate).
        else JSON.generate([value]) == JSON.generate([value.to_s]) ? value : nil
        end
      end
    end

    # The retry ladder's settings as handed to the engine, which checks them
    # (max_attempts at least 1, delays not negative, max_delay not shorter
    # than initial_delay) when the consumer is declared.
    RetryPolicy = Struct.new(:max_attempts, :initial_delay, :max_delay, keyword_init: true) do
      def self.from(options)
        return options if options.is_a?(self)

        options = (options || {}).to_h.transform_keys(&:to_sym)
        unknown = options.keys - %i[max_attempts initial_delay max_delay]
        unless unknown.empty?
          raise ConfigurationError, "unknown retries: option(s) #{unknown.join(', ')}: use max_attempts, initial_delay, max_delay"
        end

        # Left out, a setting is nil here and the engine's default there.
        # A negative count cannot cross into the engine's unsigned field; as 0
        # it gets the engine's own refusal ("at least 1").
        new(max_attempts: number(options, :max_attempts) { |v| Integer(v).clamp(0, 2**32 - 1) },
            initial_delay: number(options, :initial_delay) { |v| Float(v) },
            max_delay: number(options, :max_delay) { |v| Float(v) }).freeze
      end

      def self.number(options, name)
        value = options[name]
        value.nil? ? nil : yield(value)
      rescue ArgumentError, TypeError
        raise ConfigurationError, "retries: #{name} must be a number, got #{value.inspect}"
      end
      private_class_method :number
    end
  end
end
