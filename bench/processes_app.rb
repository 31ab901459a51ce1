# frozen_string_literal: true

# The application bench/processes.rb runs with `acemq run --processes N`:
# ActiveRecord and ActiveSupport eager loaded (the heap a Rails app boots
# with, which the children share copy-on-write), and one consumer whose
# handler either does WORK_ITERS turns of a pure-Ruby loop (about 1 ms,
# calibrated by the bench) or sleeps SLEEP seconds. Each handled message
# appends the monotonic clock (system-wide on Linux) to ENV["LOG"]: the
# bench reads when the last one was handled.
require "active_record"
require "active_support/all"
require "acemq"

ActiveSupport.eager_load!
ActiveRecord.eager_load!

class BenchProcessesConsumer < AceMQ::Rails::Consumer
  queue ENV.fetch("QUEUE")
  concurrency Integer(ENV.fetch("CONCURRENCY"))
  prefetch 20
  ITERS = Integer(ENV.fetch("WORK_ITERS", "0"))
  SLEEP = Float(ENV.fetch("SLEEP", "0"))

  def call(_message)
    if ITERS.positive?
      x = 0
      i = 0
      while i < ITERS
        x += (i * i) % 7
        i += 1
      end
    end
    sleep SLEEP if SLEEP.positive?
    File.open(ENV.fetch("LOG"), "a") { |f| f.write("#{Process.clock_gettime(Process::CLOCK_MONOTONIC)}\n") }
    accept
  end
end

AceMQ::Rails.configure do |c|
  c.url = ENV.fetch("AMQP_URL")
  c.origin = "acemq-bench-processes"
  c.health_port = 0
  c.health_host = "127.0.0.1"
  c.logger = Logger.new($stdout, level: :warn) if ENV["QUIET"]
end
