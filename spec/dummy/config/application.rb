# frozen_string_literal: true

require_relative "boot"

# Only the frameworks a consumer process needs, and ActionController's
# routing for the dashboard mounted in config/routes.rb (AceMQ::Web): no
# views, no mailer, no assets. ActiveRecord for the stores and the charges
# table.
require "rails"
require "active_record/railtie"
require "action_controller/railtie"
# No require "acemq/web": AceMQ::Web is autoloaded where config/routes.rb
# names it, as docs/web.md's mount sample is printed (issue 48).
require "acemq"

module Dummy
  class Application < ::Rails::Application
    config.load_defaults ::Rails::VERSION::STRING.to_f
    # Rails finds an application's root by the config.ru above it, and this
    # one has none (no web stack): without this line, `require
    # "./spec/dummy/config/environment"` from the repository would take the
    # repository for the app, and find no app/ to load.
    config.root = File.expand_path("..", __dir__)
    # Zeitwerk explicitly: app/consumers is autoloaded and eager loaded like
    # any other directory under app/ (load_defaults 6.0+ already chooses it).
    config.autoloader = :zeitwerk
    config.eager_load = false
    # A migration run from a spec must not rewrite a file in the repository.
    config.active_record.dump_schema_after_migration = false
    # The runner's log on standard output (a Procfile process, a container),
    # unbuffered so a supervisor reading the pipe sees each line as it is
    # written.
    if ENV["RAILS_LOG_TO_STDOUT"].present?
      $stdout.sync = true
      config.logger = ActiveSupport::Logger.new($stdout)
    end
  end
end
