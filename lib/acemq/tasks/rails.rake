# frozen_string_literal: true

# The Railtie's tasks. Each loads the application first (:environment), so
# the consumers, the initializer's configuration and the database are there.
namespace :acemq do
  desc "Run the consumers (app/consumers) until TERM: ONLY=A,B runs some of them"
  task run: :environment do
    exit AceMQ::Rails.runner(only: ENV["ONLY"]).run
  end

  desc "Show the consumers' queues, rungs, DLQs, the outbox and the runner's rates (acemq status): " \
       "JSON=1, ONLY=A,B, METRICS=url|none, INTERVAL=seconds, RABBITMQCTL=cmd|none"
  task status: :environment do
    require "acemq/status/command"
    code = AceMQ::Status::Command.new(only: ENV["ONLY"], metrics: ENV["METRICS"], interval: Float(ENV.fetch("INTERVAL", "1")),
                                      rabbitmqctl: ENV["RABBITMQCTL"], json: ENV["JSON"] == "1").run
    exit(code) unless code.zero?
  end

  desc "Remove idempotency keys past their retention (the shipped ActiveRecord store)"
  task purge_idempotency: :environment do |task|
    # The guide has an application write its own acemq:purge_idempotency
    # (lib/tasks/acemq_idempotency.rake, for its own store). Rake appends
    # that to this task instead of replacing it, so both would run, each
    # printing a count and the second always 0: the application's own is the
    # one it asked for.
    next if task.actions.any? { |action| action.source_location&.first != __FILE__ }

    require "acemq/rails/active_record_idempotency_store"
    removed = AceMQ::Rails::ActiveRecordIdempotencyStore.new.purge_expired
    puts "removed #{removed} expired keys"
  end

  namespace :outbox do
    desc "Show the outbox backlog: rows waiting, the oldest age, and failing rows with their last error"
    task backlog: :environment do
      require "acemq/tasks/outbox"
      store = AceMQ::Rails.outbox_store || begin
        require "acemq/rails/outbox"
        AceMQ::Rails::Outbox.new.store # acemq_outbox on ActiveRecord's database
      end
      report = AceMQ::OutboxTasks.backlog_report(store)
      puts report[:text]
      abort("acemq: outbox backlog past ACEMQ_OUTBOX_MAX_AGE") if report[:alarm]
    end
  end

  namespace :dlq do
    desc "Show the newest dead letters of a queue without taking them: acemq:dlq:peek[queue,limit]"
    task :peek, %i[queue limit] => :environment do |_, args|
      queue = args[:queue] or abort("usage: bin/rails 'acemq:dlq:peek[shop.payments,10]'")
      mq = AceMQ::AMQP::Connection.open(AceMQ::Rails.config.url, origin: "#{AceMQ::Rails.config.origin}:dlq",
                                        tls: AceMQ::Rails.config.tls)
      begin
        letters = mq.peek_dead_letters(queue, limit: Integer(args[:limit] || 10))
        puts "#{queue}.dlq: #{letters.empty? ? 'empty' : "#{letters.size} shown"}"
        letters.each do |d|
          puts "  #{d.id} #{d.type || '-'} attempt #{d.attempt}" \
               "#{d.failed_at ? " at #{d.failed_at.utc.strftime('%F %T')}Z" : ''}: " \
               "#{d.reason}#{d.error_class ? " (#{d.error_class})" : ''}"
          # Where it was raised (x-acemq-backtrace), one frame a line.
          d.backtrace&.each_line { |frame| puts "      #{frame.chomp}" }
          puts "    #{d.body.byteslice(0, 200).inspect}"
        end
      ensure
        mq.close
      end
    end

    desc "Move dead letters back to their queue, attempts reset: acemq:dlq:replay[queue,limit]"
    task :replay, %i[queue limit] => :environment do |_, args|
      queue = args[:queue] or abort("usage: bin/rails 'acemq:dlq:replay[shop.payments,100]'")
      mq = AceMQ::AMQP::Connection.open(AceMQ::Rails.config.url, origin: "#{AceMQ::Rails.config.origin}:dlq",
                                        tls: AceMQ::Rails.config.tls)
      begin
        report = mq.replay_dead_letters(queue, limit: args[:limit] && Integer(args[:limit]))
        puts "replayed #{report.replayed} from #{queue}.dlq (#{report.skipped} left)"
      ensure
        mq.close
      end
    end
  end

  namespace :topology do
    desc "Declare every consumer's exchanges, queue, DLQ and bindings (idempotent)"
    task apply: :environment do
      mq = AceMQ::AMQP::Connection.open(AceMQ::Rails.config.url, origin: "#{AceMQ::Rails.config.origin}:topology",
                                        tls: AceMQ::Rails.config.tls)
      begin
        AceMQ::Rails.eager_load!
        consumers = AceMQ::Rails.config.consumers || AceMQ::Rails::Consumer.consumers
        consumers.each do |klass|
          klass.topology.apply(mq)
          puts "#{klass.name}: #{klass.queue_name} (+ .dlq)#{klass.bindings.map { |e, _, k| " <- #{e}/#{k}" }.join}"
        end
      ensure
        mq.close
      end
    end
  end
end
