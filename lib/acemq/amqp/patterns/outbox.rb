# frozen_string_literal: true

require "acemq/amqp/sql"
require "acemq/amqp/patterns/outbox_record"
require "acemq/amqp/patterns/outbox_backlog"
require "acemq/amqp/patterns/sql_outbox_store"
require "acemq/amqp/patterns/outbox_listener"
require "acemq/amqp/patterns/outbox_relay"
