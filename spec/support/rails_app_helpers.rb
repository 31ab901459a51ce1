# frozen_string_literal: true

require "fileutils"
require "open3"
require "rbconfig"
require "tmpdir"

# The Rails application in spec/dummy, driven from outside as its users
# drive theirs: bin/rails, rspec and the runner in child processes, on a
# database of the example group's own (a SQLite file, or a PostgreSQL schema
# made for the run and dropped after it).
module RailsAppHelpers
  ROOT = File.expand_path("../..", __dir__)
  LIB = File.join(ROOT, "lib")
  DUMMY = File.join(ROOT, "spec", "dummy")
  RSPEC = Gem.bin_path("rspec-core", "rspec")

  # What every child starts from: the test environment unless a call says
  # otherwise, the broker the suite uses, and nothing of the parent's
  # database choice (each call names its own).
  BASE_ENV = { "RAILS_ENV" => "test", "AMQP_URL" => AceMQSpecHelpers::AMQP_URL, "DATABASE_URL" => nil,
               "ACEMQ_DUMMY_SQLITE" => nil, "ACEMQ_DUMMY_SCHEMA" => nil, "RAILS_LOG_TO_STDOUT" => nil }.freeze

  # A database for one example group: env is what the app's
  # config/database.yml reads, execute runs SQL on it with the driver, drop
  # removes it.
  class Database
    attr_reader :name, :env

    def self.sqlite(dir)
      new("SQLite", { "ACEMQ_DUMMY_SQLITE" => File.join(dir, "app.sqlite3") })
    end

    # A schema of its own in the suite's PostgreSQL database, so suites
    # running at once on one server never see each other's tables.
    def self.postgres(schema)
      require "pg"
      conn = PG.connect(AceMQSpecHelpers::DATABASE_URL)
      conn.set_notice_processor { |_| }
      conn.exec("CREATE SCHEMA #{conn.quote_ident(schema)}")
      conn.exec("SET search_path TO #{conn.quote_ident(schema)}")
      new("PostgreSQL", { "DATABASE_URL" => AceMQSpecHelpers::DATABASE_URL, "ACEMQ_DUMMY_SCHEMA" => schema },
          pg: conn, schema: schema)
    end

    # A database of its own on the suite's MariaDB (a MySQL schema is a
    # database), dropped after.
    def self.mysql(name)
      require "mysql2"
      require "uri"
      u = URI(AceMQSpecHelpers::MYSQL_URL)
      conn = Mysql2::Client.new(host: u.host, port: u.port || 3306, username: u.user, password: u.password,
                                encoding: "utf8mb4")
      conn.query("CREATE DATABASE #{name} CHARACTER SET utf8mb4")
      conn.select_db(name)
      url = u.dup.tap { |x| x.path = "/#{name}" }.to_s
      new("MariaDB", { "DATABASE_URL" => url }, mysql: conn, schema: name)
    end

    def initialize(name, env, pg: nil, schema: nil, mysql: nil)
      @name = name
      @env = env.freeze
      @pg = pg
      @mysql = mysql
      @schema = schema
    end

    def mysql? = !@mysql.nil?

    def postgres? = !@pg.nil?

    def execute(sql)
      if @mysql
        @mysql.query(sql, as: :array)&.to_a || []
      elsif @pg
        @pg.exec(sql).values
      else
        require "sqlite3"
        db = SQLite3::Database.new(@env.fetch("ACEMQ_DUMMY_SQLITE"))
        begin
          db.busy_timeout = 5000
          db.execute(sql)
        ensure
          db.close
        end
      end
    end

    def drop
      if @mysql
        @mysql.query("DROP DATABASE IF EXISTS #{@schema}")
        @mysql.close
        return
      end
      return unless @pg

      @pg.exec("DROP SCHEMA IF EXISTS #{@pg.quote_ident(@schema)} CASCADE")
      @pg.close
    end
  end

  # Run cmd in dir; [output (stdout and stderr together), status]. The child
  # leads a process group of its own, killed whole if it outlives timeout,
  # so a runner it started goes with it.
  def run_in(dir, env, *cmd, timeout: 90)
    output = +""
    Open3.popen2e(BASE_ENV.merge(env), *cmd, chdir: dir, pgroup: true) do |stdin, out, thread|
      stdin.close
      reader = Thread.new { output << out.read }
      unless thread.join(timeout)
        begin
          Process.kill("KILL", -thread.pid)
        rescue Errno::ESRCH
          nil
        end
        thread.join
        reader.join
        raise "#{cmd.join(' ')} (in #{dir}) did not finish within #{timeout}s:\n#{output}"
      end
      reader.join
      return [output, thread.value]
    end
  end

  def rails_in(dir, env, *args, **options) = run_in(dir, env, RbConfig.ruby, "bin/rails", *args, **options)
  def rspec_in(dir, env, *args, **options) = run_in(dir, env, RbConfig.ruby, RSPEC, *args, **options)

  # A copy of the app in a temporary directory, loading AceMQ from this
  # checkout as the original does, and without the original's tmp/ and log/.
  def copy_app(into)
    copy = File.join(into, "app")
    FileUtils.mkdir_p(copy)
    Dir.children(DUMMY).reject { |c| %w[tmp log].include?(c) }.each { |c| FileUtils.cp_r(File.join(DUMMY, c), copy) }
    boot = File.join(copy, "config", "boot.rb")
    File.write(boot, File.read(boot).sub('File.expand_path("../../../lib", __dir__)', LIB.inspect))
    copy
  end
end
