# frozen_string_literal: true

require "json"

# A handler that raises, in the dummy Rails app on RabbitMQ
# (spec/fixtures/rails_error_report_app.rb, in a child process): reported
# once to Rails.error on Rails 7 and later, with the consumer, queue,
# message id and attempt, and logged at warn on every Rails. On Rails 6.1,
# which has no Rails.error, only the log.
RSpec.describe "Handler failures reported through Rails.error and the log" do
  include RailsAppHelpers

  around do |example|
    Dir.mktmpdir("acemq-rails-error") do |dir|
      @tmp = dir
      example.run
    end
  end

  it "reports each exception once, handled, with the consumer, queue, message id and attempt, and logs it" do
    queue = unique("rails-error")
    batch_queue = unique("rails-error-batch")
    env = RailsAppHelpers::Database.sqlite(@tmp).env.merge("ACEMQ_QUEUE" => queue, "ACEMQ_BATCH_QUEUE" => batch_queue)
    out, status = run_in(RailsAppHelpers::ROOT, env, RbConfig.ruby, "spec/fixtures/rails_error_report_app.rb")
    expect(status).to be_success, out
    result = JSON.parse(out.lines.last)
    ids = result.fetch("ids")

    expect(result["log"].size).to eq(2), out
    expect(result["log"].find { |l| l.include?(queue) })
      .to include("acemq: FailingConsumer raised on #{queue} #{ids['A-1']} attempt 1: ArgumentError: no such order A-1")
    expect(result["log"].find { |l| l.include?(batch_queue) })
      .to include("acemq: FailingBatchConsumer raised on #{batch_queue} #{ids['B-2']} attempt 1: KeyError")

    unless Gem::Version.new(result["rails"]) >= Gem::Version.new("7.0")
      # Rails 6.1: no Rails.error to report to, and nothing tried to.
      expect(result["reports"]).to be_nil
      next
    end

    reports = result["reports"]
    # Once each: the executor the exception passes through does not report
    # it again as unhandled.
    expect(reports.size).to eq(2), out
    single = reports.find { |r| r["error"] == "ArgumentError" }
    expect(single).to include("message" => "no such order A-1", "handled" => true, "severity" => "warning")
    expect(single["context"]).to include("consumer" => "FailingConsumer", "queue" => queue, "message_id" => ids["A-1"],
                                         "attempt" => "1", "routing_key" => queue, "redelivered" => "false",
                                         # set by the handler: the report is made inside the executor
                                         "order_id" => "A-1")
    batch = reports.find { |r| r["error"] == "KeyError" }
    expect(batch).to include("handled" => true)
    expect(batch["context"]).to include("consumer" => "FailingBatchConsumer", "queue" => batch_queue,
                                        "message_id" => ids["B-2"], "attempt" => "1")
    # Rails 7.1 added source:; 7.0 reports without one.
    if Gem::Version.new(result["rails"]) >= Gem::Version.new("7.1")
      expect(reports.map { |r| r["source"] }).to all(eq("handler.acemq"))
    end
  end
end
