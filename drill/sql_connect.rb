# frozen_string_literal: true

require "acemq/amqp"

module Drill
  # A connection to the drill's database as an application opens one: the
  # pg gem for a postgres:// URL, mysql2 (utf8mb4) for a mysql2:// URL.
  # Loaded by the drill and by its relay processes (drill/relay.rb). The
  # library's own (AceMQ::AMQP::SQL.open_url), which `acemq web
  # --dead-letter-store` opens its store with too.
  def self.sql_connect(url) = AceMQ::AMQP::SQL.open_url(url)
end
