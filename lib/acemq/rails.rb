# frozen_string_literal: true

require "acemq/amqp"
require "acemq/amqp/patterns"
require "acemq/rails/configuration"
require "acemq/rails/consumer"
require "acemq/runner"

module AceMQ
  # AceMQ in an application: consumer classes, their runner, and its
  # configuration. Nothing here needs Rails itself; with Rails, the Railtie
  # adds the rake tasks, the generators, the executor around each handler
  # call and eager loading of app/consumers.
  #
  # Inside this module `Rails` is AceMQ::Rails: the framework is ::Rails.
  module Rails
    # Loaded when first named, not by `require "acemq"`: they touch
    # ActiveRecord, which must not be loaded before the application has
    # configured it.
    autoload :ActiveRecordIdempotencyStore, "acemq/rails/active_record_idempotency_store"
    autoload :ActiveRecordSource, "acemq/rails/active_record_source"
    autoload :Outbox, "acemq/rails/outbox"

    class << self
      def config = (@config ||= Configuration.new)

      def configure
        yield config
        config
      end

      def logger = config.logger

      # The connection consumers and application code publish on. In the
      # runner it is a connection of its own, apart from the consuming one;
      # elsewhere (a web process, a console) it is opened on first use.
      def publisher
        @publisher_lock.synchronize do
          @publisher = nil if @publisher&.closed?
          @publisher ||= AMQP::Connection.open(config.url, origin: "#{config.origin}:publish",
                                                            connect_timeout: config.connect_timeout,
                                                            confirm_timeout: config.confirm_timeout,
                                                            heartbeat: config.heartbeat, tls: config.tls)
        end
      end

      # The publisher if one is open or was set, without opening one (what a
      # test kit saves and restores).
      def current_publisher = @publisher_lock.synchronize { @publisher }

      # The runner sets its own; a spec may set a memory:// one.
      def publisher=(connection)
        @publisher_lock.synchronize { @publisher = connection }
      end

      # The consumer classes the runner runs, as `acemq run` finds them
      # (`only:` names some of them): what `acemq status` looks at.
      def consumers(only: nil) = select_consumers(only)

      # A Runner for the configured consumers (`only:` names some of them).
      # With `processes:` (or config.processes) above 1, an AceMQ::Swarm
      # that forks that many runners; both answer #run with the exit status.
      def runner(only: nil, processes: nil)
        n = Integer(processes || config.processes || 1)
        return Runner.new(consumers: select_consumers(only), config: config, executor: executor) if n == 1

        require "acemq/swarm"
        Swarm.new(processes: n, consumers: select_consumers(only), config: config, executor: executor)
      end

      # What wraps each handler call: the Rails executor (the reloader when
      # code reloading is on), so connections go back to the pool and
      # per-request state is reset after every message. nil without Rails.
      #
      # ActiveRecord without a Rails application (`acemq run -r app.rb`):
      # the thread's connections go back to the pool after every message,
      # as the Rails executor would give them back. Kept instead, a
      # connection that broke (the database restarted, its backend
      # terminated) stays the thread's, and ActiveRecord 6.1 and 7.0 do not
      # reconnect a connection in use: every message after fails. Checked out
      # again, it is verified and reconnected first.
      def executor
        unless defined?(::Rails.application) && ::Rails.application
          return nil unless defined?(::ActiveRecord::Base)

          return lambda do |&block|
            block.call
          ensure
            # Through the handler: ActiveRecord::Base.clear_active_connections!
            # is gone in 7.2 (NoMethodError on every message there).
            ::ActiveRecord::Base.connection_handler.clear_active_connections!
          end
        end

        app = ::Rails.application
        wrapper = app.config.cache_classes ? app.executor : app.reloader
        ->(&block) { wrapper.wrap(&block) }
      end

      # The store the outbox relay and acemq:outbox:backlog use: config.outbox
      # (an AceMQ::Rails::Outbox, a SQLOutboxStore, or a callable returning
      # either), or nil when none is configured.
      def outbox_store
        outbox = config.outbox
        outbox = outbox.call if outbox.respond_to?(:call) && !outbox.respond_to?(:backlog)
        outbox.respond_to?(:relay) && outbox.respond_to?(:store) ? outbox.store : outbox
      end

      # The store the runner's dead-letter ingesters write to (and the
      # dashboard reads, unless it is given another): config.dead_letter_store
      # resolved by SQLDeadLetterStore.resolve (a callable called,
      # :active_record built on ActiveRecord::Base's pool), or nil when none
      # is configured.
      def dead_letter_store = AMQP::SQLDeadLetterStore.resolve(config.dead_letter_store)

      def eager_load!
        ::Rails.application.eager_load! if defined?(::Rails.application) && ::Rails.application
      end

      private

      def select_consumers(only)
        eager_load!
        all = config.consumers || Consumer.consumers
        return all if only.nil? || only.empty?

        names = Array(only).flat_map { |n| n.to_s.split(",") }.map(&:strip).reject(&:empty?)
        unknown = names - all.map(&:name)
        unless unknown.empty?
          raise AMQP::ConfigurationError,
                "no consumer named #{unknown.join(', ')}: the consumers are #{all.map(&:name).join(', ')}"
        end
        all.select { |k| names.include?(k.name) }
      end
    end

    @publisher_lock = Mutex.new
  end
end

require "acemq/rails/railtie" if defined?(::Rails::Railtie)
