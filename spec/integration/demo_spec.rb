# frozen_string_literal: true

require "open3"
require "rbconfig"

# `rake demo` is the README's first command: it must run, and say what the
# tutorial says, on both transports.
RSpec.describe "bin/demo" do
  demo = File.expand_path("../../bin/demo", __dir__)

  { "memory://" => {}, "RabbitMQ" => { "AMQP_URL" => AMQP_URL } }.each do |name, env|
    it "runs Tutorial 3 end to end on #{name}" do
      out, err, status = Open3.capture3(env, RbConfig.ruby, demo)
      expect(status).to be_success, err
      expect(out).to include("charged A-1 (2 so far)")                        # Step 1: the duplicate
      expect(out.scan("charged A-1").size).to eq(3)                           # Step 2 charged it once more, not twice
      expect(out).to include("confirmed?(").and include(") = true")           # Step 3
      expect(out).to include("the outbox holds 1 message")                     # Step 5: the rollback took A-4 with it
      expect(out).to include('received {"order_id"=>"A-3"} (order.placed.v2)')
      expect(out).to include("payments rows for A-5: 1")                        # Step 6
    end
  end
end
