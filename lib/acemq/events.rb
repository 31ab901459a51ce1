# frozen_string_literal: true

module AceMQ
  # The engine's events in Ruby (docs/events.md has every name and key).
  #
  #   AceMQ.subscribe("process.acemq") { |event| Stats.timing("mq.#{event[:outcome]}", event[:duration]) }
  #   AceMQ.subscribe { |event| puts event.name }          # every event
  #
  # In a Rails app the same events are also ActiveSupport::Notifications
  # events of the same names (the Railtie turns that on, with
  # AceMQ::Rails::LogSubscriber attached under `acemq`).
  #
  # Where a subscriber runs: events the engine produces (publish, process,
  # retry, dead_letter, outbox, connection, subscription, runner) come from
  # its own threads, which may not call Ruby; they are queued (bounded, and a
  # full queue drops the event and counts it in AceMQ::Events.dropped rather
  # than hold up the engine) and delivered in order on one Ruby thread,
  # "acemq-events". idempotency events are decided on the handler's thread
  # and delivered there, inline, before the message is settled. A
  # subscriber that raises is reported with warn and changes nothing.
  #
  # While nobody subscribes the engine is not even asked for events.
  module Events
    KINDS = %w[publish process retry dead_letter idempotency outbox connection subscription runner].freeze
    NAMES = KINDS.map { |k| "#{k}.acemq" }.freeze

    # What a plain subscriber receives. payload has symbol keys; event[:key]
    # reads it.
    Event = Struct.new(:name, :payload, :time) do
      def [](key) = payload[key]
    end

    # What #subscribe returns, for #unsubscribe.
    Subscriber = Struct.new(:pattern, :block) do
      def match?(name) = pattern.nil? || pattern === name # rubocop:disable Style/CaseEquality
    end

    # How long the dispatcher waits in one call before looking again.
    POLL = 0.25

    @subscribers = [].freeze
    @lock = Mutex.new
    @active_support = false
    @dispatcher = nil

    class << self
      # Call block with every event named name ("process.acemq", :process,
      # a Regexp, or nil for all). Returns a Subscriber for #unsubscribe.
      def subscribe(name = nil, &block)
        raise AMQP::ConfigurationError, "AceMQ.subscribe needs a block" unless block

        subscriber = Subscriber.new(pattern_for(name), block)
        @lock.synchronize do
          @subscribers = [*@subscribers, subscriber].freeze
          listen_locked
        end
        subscriber
      end

      # Stop calling a subscriber. Once none is left (and ActiveSupport is
      # not bridged) the engine stops producing events.
      def unsubscribe(subscriber)
        @lock.synchronize do
          @subscribers = (@subscribers - [subscriber]).freeze
          listen_locked
        end
        nil
      end

      # Also publish every event as an ActiveSupport::Notifications event
      # (the Railtie calls this). Off again with active_support!(false).
      def active_support!(on = true)
        @lock.synchronize do
          @active_support = on && defined?(::ActiveSupport::Notifications) ? true : false
          listen_locked
        end
      end

      def active_support? = @active_support

      # Whether anything listens to name now (a plain subscriber or, when
      # bridged, an ActiveSupport one).
      def listening?(name)
        @subscribers.any? { |s| s.match?(name) } ||
          (@active_support && ::ActiveSupport::Notifications.notifier.listening?(name))
      end

      # Deliver an event produced on this Ruby thread, inline. Returns
      # whether anything listened.
      def instrument(name, payload)
        return false unless listening?(name)

        deliver(name, payload)
        true
      end

      # Events lost because the queue to the dispatcher was full.
      def dropped = _dropped

      # The engine's metrics in the Prometheus text format (recording starts
      # at the first call, or when the runner's health endpoint starts).
      def metrics = _metrics

      # Start recording metrics now, before the first #metrics.
      def record_metrics! = _metrics_enable

      private

      def pattern_for(name)
        case name
        when nil, Regexp then name
        else
          s = name.to_s
          s = "#{s}.acemq" unless s.end_with?(".acemq")
          unless NAMES.include?(s)
            raise AMQP::ConfigurationError, "unknown event #{name.inspect}: use one of #{NAMES.join(', ')} (or nil for all)"
          end

          s
        end
      end

      def listen_locked
        if @subscribers.empty? && !@active_support
          _unlisten
        else
          _listen
          start_dispatcher_locked
        end
      end

      def start_dispatcher_locked
        return if @dispatcher&.alive? && @dispatcher_pid == Process.pid

        @dispatcher_pid = Process.pid
        @dispatcher = Thread.new { dispatch_loop }
        @dispatcher.name = "acemq-events"
      end

      def dispatch_loop
        loop do
          batch = begin
            _next(POLL)
          rescue StopIteration # nobody listens any more
            break
          end

          batch&.each { |event| deliver(event[:name], event[:payload]) }
        end
      end

      def deliver(name, payload)
        time = Time.now
        @subscribers.each do |s|
          next unless s.match?(name)

          begin
            s.block.call(Event.new(name, payload, time))
          rescue StandardError => e
            warn("acemq: an AceMQ.subscribe(#{name.inspect}) subscriber raised #{e.class}: #{e.message}")
          end
        end
        return unless @active_support && ::ActiveSupport::Notifications.notifier.listening?(name)

        begin
          ::ActiveSupport::Notifications.instrument(name, payload)
        rescue StandardError => e
          warn("acemq: an ActiveSupport subscriber to #{name} raised #{e.class}: #{e.message}")
        end
      end

      # A forked child has no dispatcher thread: start one if the parent was
      # listening (Ruby 3.1's Process._fork hook).
      def after_fork
        @lock.synchronize { listen_locked unless @subscribers.empty? && !@active_support }
      end
    end

    # Restarts the dispatcher in a forked child.
    module ForkHook
      def _fork
        pid = super
        AceMQ::Events.__send__(:after_fork) if pid.zero?
        pid
      end
    end
    Process.singleton_class.prepend(ForkHook) if Process.respond_to?(:_fork)
  end

  class << self
    # AceMQ::Events.subscribe.
    def subscribe(name = nil, &block) = Events.subscribe(name, &block)

    # AceMQ::Events.unsubscribe.
    def unsubscribe(subscriber) = Events.unsubscribe(subscriber)

    # The metrics text (AceMQ::Events.metrics).
    def metrics = Events.metrics
  end
end
