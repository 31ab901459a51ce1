# frozen_string_literal: true

require "json"
require "acemq/version"
require "acemq/native"
require "acemq/events"
require "acemq/amqp/envelope"
require "acemq/amqp/message"
require "acemq/amqp/ack"
require "acemq/amqp/tracing"
require "acemq/amqp/topology"
require "acemq/amqp/subscription"
require "acemq/amqp/batch"
require "acemq/amqp/connection"
