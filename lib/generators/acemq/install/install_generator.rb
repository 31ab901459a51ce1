# frozen_string_literal: true

require "rails/generators"
require "rails/generators/active_record/migration"

module AceMQ
  module Generators
    # `bin/rails g acemq:install`: the initializer, the migrations for the
    # idempotency, outbox and dead-letter tables, and the runner's Procfile
    # line.
    class InstallGenerator < ::Rails::Generators::Base
      include ::ActiveRecord::Generators::Migration

      # "acemq", not the "ace_mq" Rails would derive from AceMQ.
      namespace "acemq:install"
      source_root File.expand_path("templates", __dir__)

      desc "Adds config/initializers/acemq.rb, the acemq_idempotency, acemq_outbox and acemq_dead_letters " \
           "migrations and a Procfile line for the consumer runner"

      class_option :outbox, type: :boolean, default: true, desc: "Add the acemq_outbox migration"
      class_option :dead_letters, type: :boolean, default: true,
                                  desc: "Add the acemq_dead_letters migration (the dead-letter store)"
      class_option :procfile, type: :boolean, default: true, desc: "Add `acemq: bundle exec acemq run` to Procfile"

      PROCFILE_LINE = "acemq: bundle exec acemq run"

      def initializer
        template "initializer.rb.tt", "config/initializers/acemq.rb"
      end

      def idempotency_migration
        migration "create_acemq_idempotency"
      end

      def outbox_migration
        migration "create_acemq_outbox" if options[:outbox]
      end

      def dead_letters_migration
        migration "create_acemq_dead_letters" if options[:dead_letters]
      end

      def procfile
        return unless options[:procfile]

        path = File.join(destination_root, "Procfile")
        lines = File.exist?(path) ? File.readlines(path, chomp: true) : nil
        if behavior == :revoke
          remove_procfile_line(path, lines)
        elsif lines.nil?
          create_file "Procfile", "#{PROCFILE_LINE}\n"
        elsif lines.any? { |l| l.match?(/\Aacemq:/) }
          # A process type of that name is already there, whatever command
          # the application gave it: leave it be.
          say_status :exist, "Procfile (acemq:)", :blue
        else
          content = File.read(path)
          append_to_file "Procfile", "#{content.empty? || content.end_with?("\n") ? '' : "\n"}#{PROCFILE_LINE}\n"
        end
      end

      def next_steps
        return unless behavior == :invoke

        say "\nNext: bin/rails db:migrate, then bin/rails g acemq:consumer NAME for each queue; " \
            "`bundle exec acemq run` runs them (docs/rails.md in the gem)."
      end

      private

      # The guide tells applications to write create_acemq_idempotency
      # themselves, so one may already be there under another timestamp:
      # that table is this one, and a second migration creating it would
      # fail. --force replaces it, as for any generated migration.
      def migration(name)
        existing = self.class.migration_exists?(File.join(destination_root, db_migrate_path), name)
        if existing && !options[:force] && behavior == :invoke
          say_status :exist, relative_to_original_destination_root(existing), :blue
          return
        end

        migration_template "#{name}.rb.tt", File.join(db_migrate_path, "#{name}.rb")
      end

      # `rails destroy acemq:install`: our line goes, the rest of the
      # Procfile stays (and the file, unless the line was all of it).
      def remove_procfile_line(path, lines)
        return unless lines&.include?(PROCFILE_LINE)

        say_status :remove, "Procfile (#{PROCFILE_LINE})", :red
        return if options[:pretend]

        rest = lines - [PROCFILE_LINE]
        rest.empty? ? File.delete(path) : File.write(path, "#{rest.join("\n")}\n")
      end

      # The running Rails' version, as Rails' own generators write it: a
      # migration is read with the semantics of the version it was written
      # for, whatever Rails runs it later.
      def migration_version = "[#{::ActiveRecord::Migration.current_version}]"
    end
  end
end
