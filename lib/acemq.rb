# frozen_string_literal: true

# `gem "acemq"` in a Gemfile requires this: the transport, the patterns, the
# consumer classes and their runner, and the Railtie when Rails is there.
require "acemq/amqp"
require "acemq/amqp/patterns"
require "acemq/rails"
