# frozen_string_literal: true

Rails.application.configure do
  config.cache_classes = true
  # CI eager loads, as production does, so a file that does not load fails
  # the suite rather than the first deploy.
  config.eager_load = ENV["CI"].present?
  # A deprecation is an error in the specs: the gem must run on the next
  # Rails too (Rails 7.2 deprecates what 8.0 removes).
  config.active_support.deprecation = :raise
end
