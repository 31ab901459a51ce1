# frozen_string_literal: true

require "spec_helper"
require "rake"

# The precompiled gem's required_ruby_version is what sends a Ruby with no
# build to the source gem (RubyGems installs the newest variant whose
# requirement is met), so it must admit exactly the Rubies built for.
RSpec.describe "rake platform_gem" do
  before(:all) { load File.expand_path("../../rakelib/platform_gem.rake", __dir__) }

  let(:requirement) { Gem::Requirement.new(PlatformGem.ruby_requirement(PlatformGem::BUILDS.keys)) }

  it "admits every patch release of the Rubies it has builds for" do
    %w[3.1.0 3.1.2 3.1.7 3.3.0 3.3.8 3.4.0 3.4.11 3.4.19].each do |ruby|
      expect(requirement).to be_satisfied_by(Gem::Version.new(ruby)), ruby
    end
  end

  it "leaves out the Ruby between them with no build, and those on either side" do
    %w[3.0.7 3.2.0 3.2.9 3.2.19 3.5.0.preview1 3.5.0 4.0.0].each do |ruby|
      expect(requirement).not_to be_satisfied_by(Gem::Version.new(ruby)), ruby
    end
  end

  it "builds for 3.1, 3.3 and 3.4 under the plain x86_64-linux name" do
    expect(PlatformGem::BUILDS.keys.sort).to eq(%w[3.1.0 3.3.0 3.4.0])
    expect(PlatformGem::PLATFORM).to eq("x86_64-linux")
  end
end
