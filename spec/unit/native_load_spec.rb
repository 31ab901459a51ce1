# frozen_string_literal: true

require "spec_helper"
require "acemq/native_load"
require "fileutils"
require "tmpdir"

# What require "acemq" says when the extension does not load: each cause
# with its own remedy (a precompiled gem of the other CPU is not fixed by
# compiling, nor a missing libsqlite3 by the source gem).
RSpec.describe AceMQ::NativeLoad do
  let(:abi) { RbConfig::CONFIG["ruby_version"] }
  let(:cpu) { RbConfig::CONFIG["host_cpu"] }
  let(:other) { cpu == "aarch64" ? "x86_64" : "aarch64" }

  # A file that starts as a shared library of the given CPU does.
  def fake_so(dir, abi, machine)
    path = File.join(dir, abi, "acemq.#{RbConfig::CONFIG['DLEXT']}")
    FileUtils.mkdir_p(File.dirname(path))
    code = described_class::ELF_MACHINES.key(machine)
    File.binwrite(path, "\x7FELF\x02\x01\x01".b + ("\0".b * 9) + [3, code].pack("vv") + ("\0".b * 44))
    path
  end

  def message(dir, error, **options)
    described_class.message(error, dir: dir, checkout: false, **options)
  end

  # The message for a gem whose build for this Ruby is one of machine's.
  def message_for(machine, error)
    Dir.mktmpdir do |dir|
      fake_so(dir, abi, machine)
      message(dir, error)
    end
  end

  it "reads the CPU a library is built for from its ELF header" do
    Dir.mktmpdir do |dir|
      expect(described_class.built_for(fake_so(dir, "a", "aarch64"))).to eq("aarch64")
      expect(described_class.built_for(fake_so(dir, "b", "x86_64"))).to eq("x86_64")
      File.write(File.join(dir, "text"), "not a library")
      expect(described_class.built_for(File.join(dir, "text"))).to be_nil
      expect(described_class.built_for(File.join(dir, "missing"))).to be_nil
    end
  end

  it "names the other CPU's gem and the command for this machine's, not the source gem" do
    text = message_for(other, "cannot open shared object file: No such file or directory")
    expect(text).to include("this is the #{other}-linux gem and this machine is #{cpu}")
    expect(text).to include("gem install acemq --platform #{cpu}-linux", "bundle lock --add-platform #{cpu}-linux")
    expect(text).not_to include("--platform ruby")
  end

  it "says to install the system SQLite library when that is what did not load" do
    text = message_for(cpu, "libsqlite3.so.0: cannot open shared object file: No such file or directory")
    expect(text).to include("needs the system SQLite library", "libsqlite3-0 on Debian and Ubuntu", "sqlite-libs")
    expect(text).not_to include("--platform ruby")
  end

  it "sends another libc or an older glibc to the source gem, naming what the build is for" do
    text = message_for(cpu, "/lib/libc.so.6: version `GLIBC_2.34' not found")
    expect(text).to include("built for #{cpu} Linux with glibc 2.34 or newer", "gem install acemq --platform ruby")
  end

  it "still says which Rubies a gem has builds for, and when it has none" do
    Dir.mktmpdir do |dir|
      fake_so(dir, "3.1.0", cpu)
      expect(message(dir, "x", ruby: "3.2.9", abi: "3.2.0")).to include("has builds for Ruby 3.1, not for 3.2.9")
    end
    Dir.mktmpdir { |dir| expect(message(dir, "x")).to include("the native extension is missing") }
  end

  it "is what require raises from an installed gem holding the other CPU's build (a child Ruby)" do
    Dir.mktmpdir do |dir|
      lib = File.join(dir, "lib")
      FileUtils.mkdir_p(File.join(lib, "acemq"))
      %w[native.rb native_load.rb errors.rb].each { |f| FileUtils.cp(File.expand_path("../../lib/acemq/#{f}", __dir__), File.join(lib, "acemq")) }
      fake_so(File.join(lib, "acemq"), abi, other)
      out = IO.popen([RbConfig.ruby, "-I", lib, "-e", 'begin; require "acemq/native"; rescue LoadError => e; print e.message; end',
                      { chdir: dir }], &:read)
      expect(out).to start_with("acemq: this is the #{other}-linux gem and this machine is #{cpu}")
    end
  end
end
