# frozen_string_literal: true

require "fileutils"
require "tmpdir"

# ActiveRecord on a real database for an example: a SQLite file of its own,
# or a PostgreSQL schema of its own (DATABASE_URL) dropped afterwards, so
# examples — and runs of other engineers' suites against the same `test`
# database — never see each other's tables, whatever the guide's fixed table
# name. The guide's migration makes the table.
module ActiveRecordSpecHelpers
  def self.postgres? = !ENV["DATABASE_URL"].to_s.empty?

  # A deprecation warning is an error in these specs, as it is in an app
  # with config.active_support.deprecation = :raise: on Rails 7.2 the gem
  # once asked the pool for #connection, which 8.0 removes. Rails 7.1+ has a
  # deprecator per framework; 6.1 has the one ActiveSupport::Deprecation.
  def self.raise_on_deprecations
    if ActiveRecord.respond_to?(:deprecator)
      [ActiveSupport.deprecator, ActiveRecord.deprecator].each { |d| d.behavior = :raise }
    else
      ActiveSupport::Deprecation.behavior = :raise
    end
  end

  # Establish ActiveRecord::Base on a fresh database of `kind` (:sqlite or
  # :postgres) and run the guide's migration; returns the configuration, for
  # a forked child to establish its own connection with.
  def establish_active_record(kind)
    SeedApp.load!
    require "acemq/rails/active_record_idempotency_store"
    config = case kind
             when :sqlite
               @ar_dir ||= Dir.mktmpdir("acemq-ar")
               { adapter: "sqlite3", database: File.join(@ar_dir, "#{unique('ar')}.sqlite3"), timeout: 10_000, pool: 10 }
             when :postgres
               @ar_schema = "acemq_ar_#{SecureRandom.hex(5)}"
               pg_admin { |c| c.exec("CREATE SCHEMA #{@ar_schema}") }
               { url: ENV.fetch("DATABASE_URL"), schema_search_path: @ar_schema, pool: 10 }
             when :mysql
               @ar_mysql_db = "acemq_ar_#{SecureRandom.hex(5)}"
               u = mysql_admin { |c| c.query("CREATE DATABASE #{@ar_mysql_db} CHARACTER SET utf8mb4") }
               { adapter: "mysql2", host: u.host, port: u.port || 3306, username: u.user, password: u.password,
                 database: @ar_mysql_db, encoding: "utf8mb4", pool: 10 }
             end
    ActiveRecordSpecHelpers.raise_on_deprecations
    ActiveRecord::Base.establish_connection(config)
    CreateAcemqIdempotency.new.migrate(:up)
    reset_active_record_models
    config
  end

  def teardown_active_record
    return unless defined?(ActiveRecord::Base)

    ActiveRecord::Base.remove_connection
    pg_admin { |c| c.exec("DROP SCHEMA IF EXISTS #{@ar_schema} CASCADE") } if @ar_schema
    mysql_admin { |c| c.query("DROP DATABASE IF EXISTS #{@ar_mysql_db}") } if @ar_mysql_db
    FileUtils.rm_rf(@ar_dir) if @ar_dir
    @ar_schema = @ar_dir = @ar_mysql_db = nil
  end

  # Models keep the columns they first read; each example's database is new.
  def reset_active_record_models
    HandledMessage.reset_column_information
    AceMQ::Rails::ActiveRecordIdempotencyStore.model_for("acemq_idempotency").reset_column_information
  end

  # Before a fork: a child must not inherit an open connection (it would
  # close the parent's PostgreSQL session on its way out, or share a SQLite
  # handle across processes). The parent reconnects when it next asks.
  def disconnect_before_fork
    ActiveRecord::Base.connection_pool.disconnect!
  end

  # Make key's claim older than any claim timeout, as though its holder had
  # died that long ago.
  def age_claim(key, by: 3600)
    recorded_at = HandledMessage.find(key).recorded_at
    HandledMessage.where(message_id: key).update_all(recorded_at: recorded_at - by)
  end

  # A connection to the suite's MariaDB (MYSQL_URL) for the block; the URL.
  def mysql_admin
    require "mysql2"
    require "uri"
    u = URI(AceMQSpecHelpers::MYSQL_URL)
    conn = Mysql2::Client.new(host: u.host, port: u.port || 3306, username: u.user, password: u.password)
    yield conn
    u
  ensure
    conn&.close
  end

  def pg_admin
    require "pg"
    conn = PG.connect(ENV.fetch("DATABASE_URL"))
    conn.set_notice_processor { |_| }
    yield conn
  ensure
    conn&.close
  end
end

RSpec.configure do |config|
  config.include ActiveRecordSpecHelpers
  config.after { teardown_active_record if defined?(@ar_schema) || defined?(@ar_dir) || defined?(@ar_mysql_db) }
end
