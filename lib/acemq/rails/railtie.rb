# frozen_string_literal: true

require "rails/railtie"

module AceMQ
  module Rails
    # Loaded by `require "acemq"` (so by Bundler) when Rails is there: the
    # rake tasks and the generators. The consumers themselves are ordinary
    # application code in app/consumers, which Rails autoloads and eager
    # loads like any other directory under app/; the gem's own files are
    # required, never autoloaded, so Zeitwerk has nothing of ours to manage.
    class Railtie < ::Rails::Railtie
      rake_tasks do
        load File.expand_path("../tasks/rails.rake", __dir__)
      end

      # The events as ActiveSupport::Notifications (process.acemq, …) with
      # their log lines: see docs/events.md.
      initializer "acemq.events" do
        require "acemq/rails/log_subscriber"
        AceMQ::Rails::LogSubscriber.attach_to :acemq
        AceMQ::Events.active_support!
      end

      generators do
        require "generators/acemq/install/install_generator"
        require "generators/acemq/consumer/consumer_generator"
      end
    end
  end
end
