# frozen_string_literal: true

require "open3"
require "rbconfig"
require "tmpdir"

# docs/testing.md says its samples run as printed, in order, in one spec
# file with the kit loaded: this runs them so, in a process of its own (the
# first sample is `require "acemq/rspec"`, which configures every example
# group of the process it is in). The RabbitMQ sample needs AMQP_URL's broker.
RSpec.describe "docs/testing.md" do
  page = File.expand_path("../../docs/testing.md", __dir__)
  lib = File.expand_path("../../lib", __dir__)

  it "runs every Ruby sample as printed" do
    samples = File.read(page).scan(/^```ruby\n(.*?)^```$/m).flatten
    expect(samples.size).to be >= 8

    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "testing_page_spec.rb"), samples.join("\n"))
      env = { "SPEC_OPTS" => nil, "AMQP_URL" => AMQP_URL }
      out, status = Open3.capture2e(env, RbConfig.ruby, "-S", "rspec", "-I", lib, "--no-color", "testing_page_spec.rb",
                                    chdir: dir)

      expect(status).to be_success, out
      ran = out[/^(\d+) examples, 0 failures$/, 1]
      expect(ran.to_i).to be >= samples.count { |s| s.include?("RSpec.describe") }, out
    end
  end
end
