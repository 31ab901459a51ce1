# frozen_string_literal: true

module AceMQ
  module AMQP
    # Exchanges, queues and bindings, declared with apply. Idempotent: run it
    # from every process at boot. Every queue gets a {queue}.dlq beside it, so
    # a reject never finds its dead-letter queue missing.
    #
    #   Topology.new
    #           .exchange("orders-events", type: :topic)
    #           .queue("payments")
    #           .bind("payments", to: "orders-events", routing_key: "order.*")
    #           .apply(mq)
    #
    # Declaring something that exists with other arguments raises
    # PreconditionFailed naming the argument. Nothing is ever deleted to make
    # a declaration fit.
    class Topology
      # The engine's lists (core's ExchangeKind and QueueType), which also
      # check a type given here.
      EXCHANGE_TYPES = AMQP::EXCHANGE_TYPES.map(&:freeze).freeze
      QUEUE_TYPES = AMQP::QUEUE_TYPES.map(&:freeze).freeze

      # A row of each list, read by name by the engine. Each still reads as
      # the Array it used to be (name, type = row; row[0]; to_a), so code
      # that took rows apart by position keeps working; comparing a row
      # with an Array does not (compare row.to_a).
      module Row
        def to_ary = to_a
      end
      ExchangeSpec = Struct.new(:name, :type) { include Row }
      QueueSpec = Struct.new(:name, :arguments, :type) { include Row }
      BindingSpec = Struct.new(:queue, :exchange, :routing_key) { include Row }

      attr_reader :exchanges, :queues, :bindings

      def initialize
        @exchanges = []
        @queues = []
        @bindings = []
      end

      def exchange(name, type: :direct)
        @exchanges << ExchangeSpec.new(Connection.text(:exchange, name.to_s), AMQP._exchange_type(type.to_s)).freeze
        self
      end

      # `arguments:` are AMQP queue arguments (x-message-ttl, x-max-length, ...).
      # `type: :quorum` declares a quorum queue, and its DLQ and the
      # consumer's rungs as quorum queues too, dead-lettering at least once
      # (see docs/production.md); the default is classic.
      def queue(name, arguments: nil, type: nil)
        type &&= AMQP._queue_type(type.to_s)

        unless arguments.nil? || arguments.is_a?(Hash)
          raise ConfigurationError, "arguments: must be a Hash of names to values, got #{arguments.class}"
        end

        # A copy of the top level: a Hash changed after this call must not change what apply declares.
        @queues << QueueSpec.new(Connection.text(:queue, name.to_s), arguments&.transform_keys(&:to_s), type).freeze
        self
      end

      def bind(queue, to:, routing_key: "")
        @bindings << BindingSpec.new(Connection.text(:queue, queue.to_s), Connection.text(:to, to.to_s),
                                     Connection.text(:routing_key, routing_key.to_s)).freeze
        self
      end

      # Declares it on connection (Connection#apply, as in Rust).
      def apply(connection)
        connection.apply(self)
        self
      end

      # Deletes this topology's queues, each with its retry rungs and its
      # DLQ: for tests, and for retiring a consumer. `retries:` is the
      # ladder the consumer was opened with (a Hash as `consume` takes it,
      # or an Array of them), the default ladder when nil. Exchanges stay;
      # bindings go with their queues; queues already gone are skipped.
      #
      # Refuses with ConfigurationError, deleting nothing, when any of those
      # queues holds a message or has a consumer; `force: true` deletes them
      # anyway. Returns the names deleted. Core's Connection::teardown does
      # the work, for Rust and Ruby alike.
      def teardown(connection, retries: nil, force: false) = connection.teardown(self, retries: retries, force: force)
    end
  end
end
