# frozen_string_literal: true

# `gem "acemq"` in a Gemfile requires this: the transport, the patterns, the
# consumer classes and their runner, and the Railtie when Rails is there.
require "acemq/amqp"
require "acemq/amqp/patterns"
require "acemq/rails"

module AceMQ
  # The dashboard, loaded when first named: `mount AceMQ::Web => "/acemq"`
  # in config/routes.rb works as the docs print it, with no require of its
  # own, and an app that never names it loads none of it (ERB, WEBrick
  # stay out of a runner).
  autoload :Web, "acemq/web"
end
