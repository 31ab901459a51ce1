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

  it "cross-builds aarch64-linux for the same Rubies, in bin/stack's sid-cross chroot" do
    expect(PlatformGem::CROSS_PLATFORM).to eq("aarch64-linux")
    expect(PlatformGem::CROSS_BUILD).to eq(%w[bin/stack run sid-cross .ci/cross-build 3.1.0 3.3.0 3.4.0])
  end

  it "refuses a platform it does not build before building anything" do
    out = `cd #{File.expand_path('../..', __dir__)} && PLATFORMS=x86_64-linux,arm64-darwin rake platform_gem 2>&1`
    expect($?.success?).to be(false)
    expect(out).to include("no platform arm64-darwin (x86_64-linux, aarch64-linux)")
    expect(out).not_to include("platform_gem: Ruby")
  end

  it "writes each gem's own platform into its metadata when one run packages both (a .ci/run shipped x86_64-linux inside the aarch64 gem)" do
    allow(PlatformGem).to receive(:glibc_needed).and_return("2.17")
    Dir.mktmpdir do |dir|
      so = File.join(dir, "fake.so")
      File.write(so, "not a library")
      builds = PlatformGem::BUILDS.keys.to_h { |abi| [abi, so] }
      gems = Dir.chdir(File.expand_path("../..", __dir__)) do
        [PlatformGem::PLATFORM, PlatformGem::CROSS_PLATFORM].map do |platform|
          path, = PlatformGem.package(platform, builds, glibc_max: "2.34")
          [platform, File.expand_path(path)]
        end
      end
      gems.each do |platform, path|
        expect(File.basename(path)).to end_with("-#{platform}.gem")
        expect(Gem::Package.new(path).spec.platform.to_s).to eq(platform)
        File.delete(path)
      end
    end
  end

  it "refuses a PLATFORMS that names none, rather than building nothing and passing" do
    ["", ","].each do |value|
      out = `cd #{File.expand_path('../..', __dir__)} && PLATFORMS=#{value} rake platform_gem 2>&1`
      expect($?.success?).to be(false), value
      expect(out).to include("PLATFORMS names no platform")
    end
  end
end

# rb-sys reads RbConfig by running $RUBY; for the aarch64 builds that is
# .ci/cross-ruby.rb, which answers with the target Ruby's rbconfig.rb.
RSpec.describe ".ci/cross-ruby.rb" do
  let(:script) { File.expand_path("../../.ci/cross-ruby.rb", __dir__) }

  def rbconfig(dir, version)
    path = File.join(dir, "usr/lib/aarch64-linux-gnu/ruby/#{version}/rbconfig.rb")
    FileUtils.mkdir_p(File.dirname(path))
    File.write(path, <<~RUBY)
      module RbConfig
        RUBY_VERSION.start_with?("#{version[/\A\d+\.\d+\./]}") or
          raise "ruby lib version (#{version}) doesn't match executable version (\#{RUBY_VERSION})"
        TOPDIR = File.dirname(__FILE__).chomp!("/lib/aarch64-linux-gnu/ruby/#{version}")
        CONFIG = {}
        CONFIG["prefix"] = TOPDIR
        CONFIG["ruby_version"] = "#{version}"
        CONFIG["rubyhdrdir"] = "\#{TOPDIR}/include/ruby-#{version}"
      end
    RUBY
    path
  end

  it "gives rb-sys's code the target Ruby's RbConfig, whatever Ruby runs it, with paths in the unpacked tree" do
    Dir.mktmpdir do |dir|
      path = rbconfig(dir, "2.9.0") # a version no Ruby running this has
      code = 'print RbConfig::CONFIG.values_at("ruby_version", "rubyhdrdir").join("|")'
      out = IO.popen([RbConfig.ruby, "--disable-gems", script, path, "--disable-gems", "-rrbconfig", "-e", code], &:read)
      expect($?.success?).to be(true)
      expect(out).to eq("2.9.0|#{dir}/usr/include/ruby-2.9.0")
    end
  end

  it "refuses a file that is not an rbconfig.rb" do
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "x.rb"), "module RbConfig; CONFIG = {}; end\n")
      out = IO.popen([RbConfig.ruby, script, File.join(dir, "x.rb"), "-e", "print 1", { err: %i[child out] }], &:read)
      expect($?.success?).to be(false)
      expect(out).to include("has no version check to drop")
    end
  end
end
