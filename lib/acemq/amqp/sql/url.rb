# frozen_string_literal: true

require "uri"

module AceMQ
  module AMQP
    module SQL
      # A connection opened from a URL, as an application opens one: the pg
      # gem for postgres:// (and postgresql://), mysql2 for mysql2:// (and
      # mysql://), in utf8mb4 (a bare mysql2 client opens utf8mb3, which the
      # stores refuse). Each opens one connection: wrap it in SQL.per_thread
      # for a store several threads use. The drivers are required here, by
      # the one who asked for them; this gem depends on neither.
      def self.open_url(url)
        u = URI(url.to_s)
        case u.scheme
        when "postgres", "postgresql"
          require "pg"
          PG.connect(url.to_s).tap { |c| c.set_notice_processor { |_| } }
        when "mysql2", "mysql"
          require "mysql2"
          Mysql2::Client.new(host: u.host, port: u.port || 3306, username: u.user && URI.decode_www_form_component(u.user),
                             password: u.password && URI.decode_www_form_component(u.password),
                             database: u.path.delete_prefix("/"), encoding: "utf8mb4")
        else
          raise ConfigurationError, "cannot open a database from #{url.to_s.sub(/:[^:@]*@/, ':***@').inspect}: " \
                                    "give a postgres:// or mysql2:// URL"
        end
      rescue URI::Error => e
        raise ConfigurationError, "not a database URL (#{e.message})"
      end

      # Is target a URL open_url takes (rather than a file's path)?
      def self.url?(target) = target.to_s.match?(%r{\A(?:postgres|postgresql|mysql2|mysql)://}i)
    end
  end
end
