# frozen_string_literal: true

Rails.application.configure do
  config.cache_classes = true
  # CI eager loads, as production does, so a file that does not load fails
  # the suite rather than the first deploy.
  config.eager_load = ENV["CI"].present?
  config.active_support.deprecation = :stderr
end
