# frozen_string_literal: true

require "securerandom"

# AceMQ in a real Rails application (spec/dummy: Debian's Rails 6.1 and
# rspec-rails 5, or Rails 7.2 and rspec-rails 7.1 with the GEM_PATH of
# bin/rails72-gems; no Bundler), with the guide's PaymentsConsumer, models,
# migration, rake task and RSpec example in it as printed. Everything runs in
# child processes, the way an application runs it: booting, migrating,
# generating, rake tasks, its own specs, the runner.
RSpec.describe "AceMQ in a Rails application (spec/dummy)" do
  include RailsAppHelpers

  root = RailsAppHelpers::ROOT
  lib = RailsAppHelpers::LIB
  dummy = RailsAppHelpers::DUMMY

  around do |example|
    Dir.mktmpdir("acemq-rails") do |dir|
      @tmp = dir
      example.run
    end
  end

  describe "loading" do
    it "survives `include AceMQ::AMQP` at top level followed by timeout, net/http, active_record, rails and bunny" do
      script = <<~RUBY
        require "acemq/amqp"
        include AceMQ::AMQP
        require "timeout"
        require "net/http"
        require "active_record"
        require "rails"
        require "bunny"
        require "acemq"
        Timeout.timeout(5) { Net::HTTP::Get }
        puts [Timeout.class, Connection, AceMQ::Rails::Railtie.superclass.name].join(" ")
      RUBY
      out, status = run_in(root, {}, RbConfig.ruby, "-I", lib, "-e", script)
      expect(status).to be_success, out
      expect(out).to include("Module AceMQ::AMQP::Connection Rails::Railtie")
    end

    it "loads acemq/rails alone, without Rails: the consumer DSL and its configuration, and no Railtie" do
      script = <<~RUBY
        require "acemq/rails"
        class ReportsConsumer < AceMQ::Rails::Consumer
          queue "reports"
        end
        puts [defined?(::Rails::Railtie).inspect, defined?(AceMQ::Rails::Railtie).inspect,
              AceMQ::Rails::Consumer.consumers.map(&:name).inspect, AceMQ::Rails.config.shutdown_timeout].join(" ")
      RUBY
      out, status = run_in(root, {}, RbConfig.ruby, "-I", lib, "-e", script)
      expect(status).to be_success, out
      expect(out).to include('nil nil ["ReportsConsumer"] 25')
    end

    it "boots with `require './spec/dummy/config/environment'`: this checkout's AceMQ, the Railtie, " \
       "app/consumers eager loaded in production by Zeitwerk, none of the gem's files autoloaded" do
      script = <<~RUBY
        require "./spec/dummy/config/environment"
        puts "zeitwerk=\#{Rails.autoloaders.zeitwerk_enabled?}"
        puts "consumers=\#{AceMQ::Rails::Consumer.consumers.map(&:name).join(',')}"
        puts "feature=\#{$LOADED_FEATURES.grep(%r{/acemq\\.rb\\z}).join(',')}"
        puts "railtie=\#{Rails.application.railties.map(&:class).include?(AceMQ::Rails::Railtie)}"
        puts "dirs=\#{Rails.autoloaders.main.dirs.join(',')}"
        puts "queue=\#{PaymentsConsumer.queue_name}"
      RUBY
      env = { "RAILS_ENV" => "production", **RailsAppHelpers::Database.sqlite(@tmp).env }
      out, status = run_in(root, env, RbConfig.ruby, "-e", script)
      expect(status).to be_success, out
      expect(out).to include("zeitwerk=true", "consumers=PaymentsConsumer", "feature=#{lib}/acemq.rb", "railtie=true",
                             "queue=shop.payments")
      dirs = out[/^dirs=(.*)$/, 1].split(",")
      expect(dirs).to include("#{dummy}/app/consumers")
      expect(dirs).to all(start_with("#{dummy}/"))
    end

    # Rails 7.2 refuses a production boot without secret_key_base, and
    # development reloads: both environments boot on the running Rails.
    %w[development production].each do |environment|
      it "boots in #{environment} with bin/rails runner and finds its consumer" do
        env = { "RAILS_ENV" => environment, **RailsAppHelpers::Database.sqlite(@tmp).env }
        out, status = rails_in(dummy, env, "runner", 'AceMQ::Rails.eager_load!; puts "#{Rails.env} " + ' \
                                                     'AceMQ::Rails::Consumer.consumers.map(&:name).join(",")')
        expect(status).to be_success, out
        expect(out).to include("#{environment} PaymentsConsumer")
      end
    end

    it "passes zeitwerk:check (Rails' eager load of every autoloaded file)" do
      out, status = rails_in(dummy, RailsAppHelpers::Database.sqlite(@tmp).env, "zeitwerk:check")
      expect(status).to be_success, out
      expect(out).to include("All is good!")
    end
  end

  # The app as its developers use it, once on each database: migrated once
  # per group, then its specs, the guide's rake task and the Railtie's.
  [
    ["SQLite", ->(dir) { RailsAppHelpers::Database.sqlite(dir) }],
    ["PostgreSQL", ->(_) { RailsAppHelpers::Database.postgres("acemq_dummy_#{SecureRandom.hex(4)}") }],
    ["MariaDB", ->(_) { RailsAppHelpers::Database.mysql("acemq_dummy_#{SecureRandom.hex(4)}") }]
  ].each do |name, open|
    context "on #{name}" do
      before(:context) do
        @dir = Dir.mktmpdir("acemq-rails-db")
        @db = open.call(@dir)
        @migrated, @migrate_status = rails_in(dummy, @db.env, "db:migrate")
      end

      after(:context) do
        @db&.drop
        FileUtils.rm_rf(@dir) if @dir
      end

      it "runs its migrations with bin/rails db:migrate (the guide's among them)" do
        expect(@migrate_status).to be_success, @migrated
        expect(@migrated).to include("CreateAcemqIdempotency: migrated", "CreateCharges: migrated")
        expect(@db.execute("SELECT version FROM schema_migrations ORDER BY version").flatten)
          .to eq(%w[20260926000100 20260926000200])
      end

      it "passes its own specs under rspec-rails, the guide's PaymentsConsumer example as printed" do
        out, status = rspec_in(dummy, @db.env, "--format", "documentation", "--no-color")
        expect(status).to be_success, out
        expect(out).to include("charges once however many times the broker delivers it", " 0 failures")
      end

      it "runs the guide's acemq:purge_idempotency and the Railtie's acemq:topology:apply and acemq:dlq:peek" do
        @db.execute("DELETE FROM acemq_idempotency")
        @db.execute("INSERT INTO acemq_idempotency (message_id, state, claimed_by, recorded_at, expires_at) " \
                    "VALUES ('spec-old', 'CONFIRMED', 'spec', '2000-01-01 00:00:00', '2000-01-02 00:00:00'), " \
                    "('spec-new', 'CONFIRMED', 'spec', '2000-01-01 00:00:00', '2999-01-01 00:00:00')")

        out, status = rails_in(dummy, @db.env, "acemq:purge_idempotency", "acemq:topology:apply",
                               "acemq:dlq:peek[shop.payments,5]")
        expect(status).to be_success, out
        # The app's own task (the guide's), not the Railtie's beside it.
        expect(out.scan(/^removed \d+ expired keys$/)).to eq(["removed 1 expired keys"])
        expect(@db.execute("SELECT message_id FROM acemq_idempotency").flatten).to eq(["spec-new"])
        expect(out).to include("PaymentsConsumer: shop.payments (+ .dlq)")
        expect(out).to match(/^shop\.payments\.dlq: (empty|\d+ shown)$/)
      ensure
        @db.execute("DELETE FROM acemq_idempotency WHERE message_id LIKE 'spec-%'")
        # acemq:topology:apply declared the guide's queue, its ladder and DLQ
        # on the shared broker: they go at the end of the run with the rest.
        AceMQSpecHelpers::NAMED << "shop.payments"
      end
    end
  end

  describe "generators, in a copy of the app that has not adopted AceMQ yet" do
    before(:context) do
      @gen_dir = Dir.mktmpdir("acemq-rails-gen")
      @copy = copy_app(@gen_dir)
      # What the guide had the app add by hand goes, so the generators write
      # it; the rest (models, Payments, the charges migration) stays.
      FileUtils.rm_rf(Dir[File.join(@copy, "{app,spec}/consumers"), File.join(@copy, "config/initializers/acemq*.rb"),
                          File.join(@copy, "db/migrate/*_create_acemq_idempotency.rb"),
                          File.join(@copy, "lib/tasks/acemq_idempotency.rake")])
      File.write(File.join(@copy, "Procfile"), "web: bin/rails server") # no newline at the end, on purpose
      @sqlite = RailsAppHelpers::Database.sqlite(@gen_dir)
      @install, @install_status = rails_in(@copy, @sqlite.env, "generate", "acemq:install")
      @consumer, @consumer_status = rails_in(@copy, @sqlite.env, "generate", "acemq:consumer", "Payments")
      # Both again, and a namespaced consumer, in one boot.
      @again, @again_status = rails_in(@copy, @sqlite.env, "runner", <<~RUBY)
        require "rails/generators"
        Rails::Generators.invoke("acemq:install", [], destination_root: Rails.root.to_s)
        Rails::Generators.invoke("acemq:consumer", ["Payments"], destination_root: Rails.root.to_s)
        Rails::Generators.invoke("acemq:consumer", ["billing/invoices"], destination_root: Rails.root.to_s)
      RUBY
    end

    after(:context) { FileUtils.rm_rf(@gen_dir) if @gen_dir }

    def generated(path) = File.read(File.join(@copy, path))
    def migration(name) = Dir[File.join(@copy, "db/migrate/*_#{name}.rb")]

    it "acemq:install writes the initializer, both migrations at the running Rails' version, and the Procfile line" do
      expect(@install_status).to be_success, @install
      # The running Rails' version, as ActiveRecord::Migration.current_version
      # gives it in the child (the newest activerecord installed).
      version = Gem::Specification.find_by_name("activerecord").version.segments.first(2).join(".")
      expect(migration("create_acemq_idempotency").size).to eq(1)
      expect(migration("create_acemq_outbox").size).to eq(1)
      idempotency = File.read(migration("create_acemq_idempotency").first)
      expect(idempotency).to include("class CreateAcemqIdempotency < ActiveRecord::Migration[#{version}]",
                                     "limit: 255, primary_key: true", 'name: "acemq_idempotency_expiry"')
      expect(File.read(migration("create_acemq_outbox").first))
        .to include("class CreateAcemqOutbox < ActiveRecord::Migration[#{version}]", "schema_sql(dialect)")
      expect(migration("create_acemq_dead_letters").size).to eq(1)
      expect(File.read(migration("create_acemq_dead_letters").first))
        .to include("class CreateAcemqDeadLetters < ActiveRecord::Migration[#{version}]", "SQLDeadLetterStore.new",
                    "schema_sql(dialect)")
      expect(generated("config/initializers/acemq.rb")).to include('c.url = ENV.fetch("AMQP_URL"',
                                                                   "c.shutdown_timeout = 25", "c.health_port =")
      expect(generated("Procfile")).to eq("web: bin/rails server\nacemq: bundle exec acemq run\n")
    end

    it "writes the initializer spec/dummy has, so the app is what the generator makes" do
      expect(generated("config/initializers/acemq.rb")).to eq(File.read(File.join(dummy, "config/initializers/acemq.rb")))
    end

    it "acemq:consumer Payments writes app/consumers/payments_consumer.rb and its spec" do
      expect(@consumer_status).to be_success, @consumer
      expect(generated("app/consumers/payments_consumer.rb"))
        .to include("class PaymentsConsumer < AceMQ::Rails::Consumer", 'queue "payments"', "retries max_attempts: 5",
                    "accept")
      expect(generated("spec/consumers/payments_consumer_spec.rb"))
        .to include('require "rails_helper"', 'require "acemq/rspec"', "RSpec.describe PaymentsConsumer", "to be_accept")
    end

    it "changes nothing when run again, and nests a namespaced consumer" do
      out = @again
      expect(@again_status).to be_success, out
      expect(out).to match(%r{identical\s+app/consumers/payments_consumer\.rb})
      expect(out).to match(%r{identical\s+config/initializers/acemq\.rb})
      expect(out).to match(/exist\s+db.migrate.\d+_create_acemq_idempotency\.rb/)
        .and match(/exist\s+db.migrate.\d+_create_acemq_outbox\.rb/)
        .and match(/exist\s+db.migrate.\d+_create_acemq_dead_letters\.rb/)
      expect(out).to match(/exist\s+Procfile/)
      expect(migration("create_acemq_idempotency").size).to eq(1)
      expect(generated("Procfile").scan("acemq:").size).to eq(1)
      expect(generated("app/consumers/billing/invoices_consumer.rb"))
        .to include("class Billing::InvoicesConsumer < AceMQ::Rails::Consumer", 'queue "billing.invoices"')
    end

    [
      ["SQLite", ->(dir) { RailsAppHelpers::Database.sqlite(dir) }],
      ["PostgreSQL", ->(_) { RailsAppHelpers::Database.postgres("acemq_gen_#{SecureRandom.hex(4)}") }],
      ["MariaDB", ->(_) { RailsAppHelpers::Database.mysql("acemq_gen_#{SecureRandom.hex(4)}") }]
    ].each do |name, open|
      it "migrates on #{name}: the generated migrations run, and the outbox and dead-letter tables are the ones " \
         "the engine's stores use" do
        db = open.call(@tmp)
        # db:migrate, then the shipped ActiveRecord outbox adds a row on the
        # app's connection and reads it back through the engine's SQL, the
        # shipped store claims a key on the generated idempotency table, and
        # the Railtie's purge removes an expired one: one boot.
        out, status = rails_in(@copy, db.env, "runner", <<~RUBY)
          Rails.application.load_tasks
          Rake::Task["db:migrate"].invoke
          require "acemq/rails/outbox"
          require "acemq/rails/active_record_idempotency_store"
          mq = AceMQ::AMQP::Connection.open("memory://gen")
          outbox = AceMQ::Rails::Outbox.new
          ActiveRecord::Base.transaction do
            outbox.add(AceMQ::AMQP::Patterns.record(mq, { "order_id" => "A-1" }, to: "order.placed", exchange: "orders"))
          end
          store = AceMQ::Rails::ActiveRecordIdempotencyStore.new
          puts "backlog=\#{outbox.backlog.count} first=\#{store.first_time?("k")},\#{store.first_time?("k")}"
          outbox.close
          AceMQ::Rails::ActiveRecordIdempotencyStore.new(retention: 0.001).first_time?("old")
          sleep 0.01
          Rake::Task["acemq:purge_idempotency"].invoke
          # The dead-letter store on the app's pool and the generated tables:
          # two letters published straight to gen.dlq are ingested, listed
          # and purged through the engine's statements on them.
          dead = AceMQ::AMQP::SQLDeadLetterStore.new(connection: ActiveRecord::Base.connection_pool)
          AceMQ::AMQP::Topology.new.queue("gen").apply(mq)
          ids = 2.times.map { |n| mq.publish({ "n" => n }, to: "gen.dlq").id.to_s }
          ingested = dead.ingest_once(mq, "gen", idle: 0.2)
          listed = dead.list(queue: "gen").letters.map(&:message_id)
          puts "dead_letters ingested=\#{ingested} rows=\#{dead.counts(queue: "gen")[:total]} " \
               "same=\#{listed.sort == ids.sort} purged=\#{dead.purge(queue: "gen", actor: "spec")}"
        RUBY
        expect(status).to be_success, out
        expect(out).to include("CreateAcemqIdempotency: migrated", "CreateAcemqOutbox: migrated",
                               "CreateAcemqDeadLetters: migrated")
        expect(out).to include("dead_letters ingested=2 rows=2 same=true purged=2")
        expect(out).to include("backlog=1 first=true,false")
        # Without the guide's own task, the Railtie's purges the shipped
        # store's keys on the generated table.
        expect(out.scan(/^removed \d+ expired keys$/)).to eq(["removed 1 expired keys"])
      ensure
        db&.drop
      end
    end

    # The app's rails_helper migrates the test database (so the generated
    # migrations run here too), and CI=1 makes its test environment eager
    # load as production does, which is Zeitwerk's check that every
    # generated file defines the constant its path names.
    it "passes the generated consumers' specs and the app's own, eager loaded" do
      env = { **RailsAppHelpers::Database.sqlite(@tmp).env, "CI" => "1" }
      out, status = rspec_in(@copy, env, "--format", "documentation", "--no-color")
      expect(status).to be_success, out
      expect(out).to include("PaymentsConsumer", "accepts a message", "settles a message delivered to payments as accepted",
                             "Billing::InvoicesConsumer", " 0 failures")
    end
  end

  describe "the runner (rake demo:rails, bin/demo-rails)" do
    it "consumes with the guide's PaymentsConsumer on RabbitMQ: a duplicate turned away, one charge, TERM exits 0" do
      out, status = run_in(root, {}, RbConfig.ruby, File.join(root, "bin", "demo-rails"), timeout: 120)
      expect(status).to be_success, out
      expect(out).to include("acemq: running 1 consumer", "/ready answers 200")
      expect(out).to match(/duplicate \S+ accepted without running the handler/)
      expect(out).to include("two deliveries, 1 charge for", "the key is CONFIRMED", "acemq: stopped",
                             "the runner drained and exited 0")
    end

    it "runs as `bin/rails acemq:run` too, and exits 0 on TERM" do
      # Booting needs no tables: the runner touches the database only when
      # a message arrives.
      db = RailsAppHelpers::Database.sqlite(@tmp)
      output = File.join(@tmp, "runner.out")
      env = RailsAppHelpers::BASE_ENV.merge(db.env, "RAILS_LOG_TO_STDOUT" => "1")
      pid = spawn(env, RbConfig.ruby, "bin/rails", "acemq:run", chdir: dummy, out: output, err: %i[child out],
                                                                  pgroup: true)
      begin
        eventually(timeout: 30) { File.read(output).include?("acemq: running 1 consumer") }
        Process.kill("TERM", pid)
        status = eventually(timeout: 30) { Process.waitpid2(pid, Process::WNOHANG)&.last }
        expect(status.exitstatus).to eq(0), File.read(output)
        expect(File.read(output)).to include("acemq: PaymentsConsumer on shop.payments", "acemq: stopped")
      ensure
        begin
          Process.kill("KILL", -pid)
          Process.wait(pid)
        rescue Errno::ESRCH, Errno::ECHILD
          nil
        end
      end
    end
  end
end
