# frozen_string_literal: true

require "rails/generators"
require "rails/generators/named_base"

module AceMQ
  module Generators
    # `bin/rails g acemq:consumer Payments`: app/consumers/payments_consumer.rb
    # on the queue "payments", and its spec when the application has spec/.
    # A namespaced name (Billing::Invoices, billing/invoices) goes under
    # app/consumers/billing/ on the queue "billing.invoices".
    class ConsumerGenerator < ::Rails::Generators::NamedBase
      namespace "acemq:consumer"
      source_root File.expand_path("templates", __dir__)

      desc "Adds a consumer class in app/consumers (and its spec in spec/consumers)"

      class_option :queue, type: :string, desc: "The queue (default: the name, dotted and underscored: billing.invoices)"
      class_option :spec, type: :boolean, desc: "Write spec/consumers/..._spec.rb (default: when spec/ exists)"

      def consumer
        template "consumer.rb.tt", File.join("app/consumers", class_path, "#{consumer_file_name}.rb")
      end

      def spec
        write = options[:spec].nil? ? File.directory?(File.join(destination_root, "spec")) : options[:spec]
        return unless write

        template "consumer_spec.rb.tt", File.join("spec/consumers", class_path, "#{consumer_file_name}_spec.rb")
      end

      private

      # `Payments` and `PaymentsConsumer` both make PaymentsConsumer.
      def base_name = file_name.delete_suffix("_consumer")
      def consumer_file_name = "#{base_name}_consumer"
      def consumer_class_name = "#{class_name.delete_suffix('Consumer')}Consumer"

      def queue_name
        name = options[:queue] || [*class_path, base_name].join(".")
        # Only emptiness is refused here; what else a name may not be (over
        # 255 bytes with its .dlq and rungs) the engine says when the class
        # loads, in one place for every way of naming a queue.
        raise ::Rails::Generators::Error, "--queue needs a name" if name.empty?

        name
      end

      # The RSpec kit, when this AceMQ has one.
      def rspec_kit? = !$LOAD_PATH.resolve_feature_path("acemq/rspec").nil?

      def spec_helper = File.exist?(File.join(destination_root, "spec/rails_helper.rb")) ? "rails_helper" : "spec_helper"
    end
  end
end
