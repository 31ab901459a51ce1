# frozen_string_literal: true

require "open3"
require "rbconfig"

# `rake demo` is the README's first command: it must run, and say what the
# tutorial says, on both transports.
RSpec.describe "bin/demo" do
  demo = File.expand_path("../../bin/demo", __dir__)

  # The memory:// run unsets AMQP_URL: inherited from the suite's own
  # environment, it sent that run to RabbitMQ as well.
  { "memory://" => { "AMQP_URL" => nil }, "RabbitMQ" => { "AMQP_URL" => AMQP_URL } }.each do |name, env|
    it "runs Tutorial 3 end to end on #{name}" do
      run = SecureRandom.hex(6)
      out, err, status = Open3.capture3(env.merge("ACEMQ_DEMO_RUN" => run), RbConfig.ruby, demo)
      expect(status).to be_success, err
      expect(out).to start_with("AceMQ demo on #{env['AMQP_URL'] ? 'amqp://' : 'memory://'}")
      expect(out).to include("charged A-1 (2 so far)")                        # Step 1: the duplicate
      expect(out.scan("charged A-1").size).to eq(3)                           # Step 2 charged it once more, not twice
      expect(out).to include("confirmed?(").and include(") = true")           # Step 3
      expect(out).to include("the outbox holds 1 message")                     # Step 5: the rollback took A-4 with it
      expect(out).to include('received {"order_id"=>"A-3"} (order.placed.v2)')
      expect(out).to include("payments rows for A-5: 1")                        # Step 6
    ensure
      # What the run declared on the shared broker goes (its queues with
      # their .dlq and .retry.* rungs, and its two exchanges).
      if env["AMQP_URL"]
        AceMQSpecHelpers.delete_idle_queues { |q| q.end_with?("-#{run}") || q.include?("-#{run}.") }
        AceMQSpecHelpers.delete_exchanges(%W[orders-events-#{run} billing-events-#{run}])
      end
    end
  end
end
