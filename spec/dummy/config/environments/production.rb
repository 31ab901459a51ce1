# frozen_string_literal: true

# What the runner boots with in a deployment (RAILS_ENV=production, as
# `rake demo:rails` runs it): classes cached and every file under app/ loaded
# at boot, app/consumers included.
Rails.application.configure do
  config.cache_classes = true
  config.eager_load = true
  config.log_level = :info
  config.active_support.deprecation = :notify
  # Rails 7.2 refuses to boot in production without a secret_key_base
  # (Rails 6.1 asked only when something signed or encrypted). This app
  # signs nothing: no web stack, no sessions, no cookies, no encrypted
  # attributes. A real application takes it from its credentials or
  # SECRET_KEY_BASE; the dummy falls back to a constant so that the runner
  # boots in production (rake demo:rails) with no secrets on the machine.
  config.secret_key_base = ENV.fetch("SECRET_KEY_BASE") { "acemq-dummy-signs-nothing" }
end
