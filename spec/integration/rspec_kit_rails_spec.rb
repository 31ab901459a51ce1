# frozen_string_literal: true

require "open3"
require "rbconfig"

# The test kit as a Rails application's suite uses it: spec/kit is one
# (rails_helper.rb boots a small application, rspec-rails, then
# `require "acemq/rspec"`), run by `rspec` in a process of its own so that
# Rails never loads into this one. Among its examples is the guide's
# PaymentsConsumer spec, as printed but for the `allow` it leaves out.
RSpec.describe "acemq/rspec under rspec-rails" do
  kit = File.expand_path("../kit", __dir__)

  it "runs the guide's consumer spec and the kit's own, under rspec-rails, green" do
    # Nothing of this run's options: the kit's directory has its own .rspec.
    env = { "SPEC_OPTS" => nil, "ACEMQ_GC_STRESS" => nil, "RAILS_ENV" => nil }
    out, status = Open3.capture2e(env, RbConfig.ruby, "-S", "rspec", "--no-color", chdir: kit)

    expect(status).to be_success, out
    expect(out).to match(/runs under rspec-rails \d+\.\d+\.\d+ on Rails \d+\.\d+\.\d+/)
    expect(out).to include("charges once however many times the broker delivers it")
    expect(out).to include("walks a gateway outage up the ladder to the DLQ")
    expect(out).to include("publishes order.placed on the orders exchange")
    expect(out).to match(/^\d+ examples, 0 failures$/)
  end
end
