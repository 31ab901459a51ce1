# frozen_string_literal: true

# What the runner boots with in a deployment (RAILS_ENV=production, as
# `rake demo:rails` runs it): classes cached and every file under app/ loaded
# at boot, app/consumers included.
Rails.application.configure do
  config.cache_classes = true
  config.eager_load = true
  config.log_level = :info
  config.active_support.deprecation = :notify
end
