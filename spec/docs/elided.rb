# frozen_string_literal: true

# What the guide's samples leave out on purpose — the application around
# them — so that every sample can run as printed (spec/docs/samples_spec.rb).
# Nothing of AceMQ is here: a sample that needs a require says it.

# The payment gateway the samples charge. charge! records the charge and
# raises on a missing order; charge answers a symbol, as docs/retries.md
# reads it. A `rails` sample has spec/dummy's instead (app/models/payments.rb,
# a row per charge), which this one would shadow.
unless ENV["DOCS_SAMPLE_RAILS"]
  module Payments
    CHARGES = Queue.new

    def self.charge!(order_id, amount = nil)
      raise ArgumentError, "no order" if order_id.nil?

      CHARGES << [order_id, amount]
      true
    end

    def self.charge(payload)
      charge!(payload["order_id"], payload["amount"])
      :ok
    end
  end
end

# Refunds, for the samples that issue one.
module Refunds
  def self.issue!(_refund_id) = true
end

def logger
  require "logger"
  @logger ||= Logger.new($stderr)
end

# Harness instrumentation, not part of any sample: a handler that raises
# inside a subscription is a retry (and a sample would never show it), so
# every consume block is wrapped to report what it raised on stderr, and the
# script waits at exit until its handlers have gone quiet.
module DocsSampleHarness
  @last = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  class << self
    attr_accessor :last

    def touch = (self.last = Process.clock_gettime(Process::CLOCK_MONOTONIC))
  end

  def consume(queue, **options, &handler)
    wrapped = proc do |message|
      DocsSampleHarness.touch
      handler.call(message)
    rescue AceMQ::AMQP::FatalError
      raise
    rescue StandardError => e
      warn "docs-sample: handler raised #{e.class}: #{e.message}" unless ENV["DOCS_SAMPLE_RAISES"]
      raise
    ensure
      DocsSampleHarness.touch
    end
    wrapped.define_singleton_method(:call_many) { |ms| handler.call_many(ms) } if handler.respond_to?(:call_many)
    super(queue, **options, &wrapped)
  end
end

at_exit do
  if defined?(AceMQ::AMQP::Connection)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 3
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline &&
          Process.clock_gettime(Process::CLOCK_MONOTONIC) - DocsSampleHarness.last < 0.3
      sleep 0.05
    end
  end
end

# Installed once the library is loaded by the sample's own require.
TracePoint.new(:end) do |tp|
  if tp.self.name == "AceMQ::AMQP::Connection" && !AceMQ::AMQP::Connection.include?(DocsSampleHarness)
    AceMQ::AMQP::Connection.prepend(DocsSampleHarness)
  end
end.enable
