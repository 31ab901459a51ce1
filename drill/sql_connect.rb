# frozen_string_literal: true

require "uri"

module Drill
  # A connection to the drill's database as an application opens one: the
  # pg gem for a postgres:// URL, mysql2 (utf8mb4) for a mysql2:// URL.
  # Loaded by the drill and by its relay processes (drill/relay.rb).
  def self.sql_connect(url)
    if url.start_with?("mysql2:")
      require "mysql2"
      u = URI(url)
      Mysql2::Client.new(host: u.host, port: u.port || 3306, username: u.user, password: u.password,
                         database: u.path.delete_prefix("/"), encoding: "utf8mb4")
    else
      require "pg"
      PG.connect(url).tap { |c| c.set_notice_processor { |_| } }
    end
  end
end
