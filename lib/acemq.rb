# frozen_string_literal: true

require "acemq/amqp"
