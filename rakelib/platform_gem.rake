# frozen_string_literal: true

# The precompiled gems, acemq-VERSION-x86_64-linux.gem and
# acemq-VERSION-aarch64-linux.gem: the Ruby files and one stripped extension
# per Ruby minor this machine can build for, at
# lib/acemq/<ruby_version>/acemq.so, where lib/acemq/native.rb looks first.
# They have no extconf.rb, so installing one compiles nothing.
# docs/releasing.md says how they are released and how the other platforms
# are built.

require "rbconfig"
require "rubygems/package"

module PlatformGem
  # x86_64-linux, not x86_64-linux-gnu: Debian 12's RubyGems 3.3.15 and
  # Bundler 2.3.15 predate the -gnu names (RubyGems 3.3.22, Bundler 2.3.21,
  # fixed in Bundler 2.5.6), and a plain linux gem is already taken as glibc
  # by the RubyGems that know musl. See docs/releasing.md.
  PLATFORM = "x86_64-linux"

  # Ruby ABI (RbConfig ruby_version) => how this machine builds it into
  # lib/acemq/<abi>/ (rake compile, under that Ruby). 3.1 is the host's
  # (Debian 12); 3.3 and 3.4 are Debian unstable's and experimental's, in
  # the chroot of bin/stack. No Debian release has 3.2: there is no build
  # for it, and required_ruby_version sends 3.2 to the source gem.
  #
  # The builds share target/, and a change of Ruby rebuilds rb-sys, magnus
  # and the extension (about 50 s each). In this order the first is free
  # after .ci/run's unstable stage (which ends with 3.4's build), and the
  # last leaves target/ as the host's own `rake compile` expects it.
  BUILDS = {
    "3.4.0" => %w[bin/stack run sid ruby3.4 -S rake compile],
    "3.3.0" => %w[bin/stack run sid rake compile],
    "3.1.0" => [RbConfig.ruby, "-S", "rake", "compile"]
  }.freeze

  # aarch64-linux is cross-compiled for the same Rubies in bin/stack's
  # sid-cross chroot (.ci/cross-build: Debian's rustc with the arm64 std and
  # gcc-aarch64-linux-gnu), which leaves stripped builds under CROSS_LIB.
  CROSS_PLATFORM = "aarch64-linux"
  CROSS_LIB = "tmp/cross/aarch64-linux/lib"
  CROSS_BUILD = %w[bin/stack run sid-cross .ci/cross-build] + BUILDS.keys.sort

  # Where the Linux builds' newest glibc symbol must stay: README's Install
  # section promises it (Debian 12 has 2.36, Ubuntu 22.04 2.35, RHEL 9 2.34).
  GLIBC_MAX = "2.34"

  # What the source gem has that a precompiled one does not need.
  SOURCE_ONLY = %r{\A(ext/|core/|vendor/|Cargo\.(toml|lock)\z)}

  # A patch number no minor of Ruby 3 will reach (3.0 ended at 3.0.7): the
  # releases of a minor with no build are excluded one by one, because a
  # requirement is an AND of conditions and cannot say "3.1 or 3.3 or 3.4".
  PATCHES = 0..19

  module_function

  def stage_dir = "tmp/platform-gem"

  def so_path(abi) = "lib/acemq/#{abi}/acemq.#{RbConfig::CONFIG['DLEXT']}"

  # ">= 3.1", "< 3.5.dev", and "!= 3.2.0" ... "!= 3.2.19" for the gap.
  # ".dev" keeps 3.5's previews out too (they sort below 3.5).
  def ruby_requirement(abis)
    minors = abis.map { |abi| Gem::Version.new(abi).segments.first(2) }.uniq.sort
    major = minors.first.first
    raise "platform gem: builds for more than one Ruby major (#{abis.join(', ')})" if minors.any? { |m, _| m != major }

    low, high = minors.first.last, minors.last.last
    gaps = (low..high).reject { |minor| minors.include?([major, minor]) }
    [">= #{major}.#{low}", "< #{major}.#{high + 1}.dev"] +
      gaps.flat_map { |minor| PATCHES.map { |patch| "!= #{major}.#{minor}.#{patch}" } }
  end

  # The newest GLIBC_x.y version a library asks for. readelf reads every
  # architecture's ELF (the host's objdump reads x86_64 only); for a build
  # of this machine's it lists what `objdump -T` does.
  def glibc_needed(path)
    versions = `readelf -W --dyn-syms --version-info #{path}`.scan(/GLIBC_([0-9.]+)/).flatten.uniq
    raise "platform gem: readelf #{path} failed" unless $?.success? && !versions.empty?

    versions.max_by { |v| Gem::Version.new(v) }
  end

  # pkg/acemq-VERSION-PLATFORM.gem from the Ruby files and the builds
  # (abi => stripped .so); each build is refused if it needs a glibc newer
  # than glibc_max. Returns [gem path, the newest glibc any build needs].
  def package(platform, builds, glibc_max:)
    # A copy: load caches the spec it read, and platform= on that one
    # object would leave the first gem's platform in the second's metadata
    # (its file name right, its `platform:` x86_64-linux).
    spec = Gem::Specification.load("acemq.gemspec").dup
    stage = "#{stage_dir}/#{platform}"
    FileUtils.rm_rf stage
    FileUtils.mkdir_p stage
    files = spec.files.grep_v(SOURCE_ONLY)
    files.each do |file|
      FileUtils.mkdir_p File.join(stage, File.dirname(file))
      FileUtils.cp file, File.join(stage, file), preserve: true
    end

    needed = builds.keys.sort.map do |abi|
      so = so_path(abi)
      FileUtils.mkdir_p File.join(stage, File.dirname(so))
      FileUtils.cp builds.fetch(abi), File.join(stage, so)
      glibc = glibc_needed(File.join(stage, so))
      if Gem::Version.new(glibc) > Gem::Version.new(glibc_max)
        abort "platform_gem: #{platform} #{so} needs GLIBC_#{glibc}, newer than #{glibc_max}"
      end
      puts format("platform_gem: %-14s %-28s %5.1f MB stripped, needs GLIBC_%s", platform, so, File.size(File.join(stage, so)) / 1e6, glibc)
      glibc
    end

    spec.platform = Gem::Platform.new(platform)
    spec.extensions = []
    spec.files = files + builds.keys.map { |abi| so_path(abi) }
    spec.required_ruby_version = ruby_requirement(builds.keys)
    built = Dir.chdir(stage) { Gem::Package.build(spec) }
    FileUtils.mkdir_p "pkg"
    FileUtils.mv File.join(stage, built), "pkg/#{built}"
    written = Gem::Package.new("pkg/#{built}").spec.platform.to_s
    abort "platform_gem: pkg/#{built} says platform #{written}, not #{platform}" unless written == platform
    puts format("platform_gem: pkg/%s, %.1f MB", built, File.size("pkg/#{built}") / 1e6)
    ["pkg/#{built}", needed.max_by { |v| Gem::Version.new(v) }]
  end
end

desc "Build pkg/acemq-VERSION-#{PlatformGem::PLATFORM}.gem and -#{PlatformGem::CROSS_PLATFORM}.gem: the extension for Ruby " \
     "#{PlatformGem::BUILDS.keys.sort.map { |abi| abi[/\A\d+\.\d+/] }.join(', ')}, stripped (needs bin/stack's sid and " \
     "sid-cross chroots; PLATFORMS=x86_64-linux builds one)"
task :platform_gem do
  platforms = ENV.fetch("PLATFORMS", "#{PlatformGem::PLATFORM},#{PlatformGem::CROSS_PLATFORM}").split(",")
  abort "platform_gem: PLATFORMS names no platform (#{PlatformGem::PLATFORM}, #{PlatformGem::CROSS_PLATFORM}, or both)" if platforms.empty?
  unknown = platforms - [PlatformGem::PLATFORM, PlatformGem::CROSS_PLATFORM]
  abort "platform_gem: no platform #{unknown.join(', ')} (#{PlatformGem::PLATFORM}, #{PlatformGem::CROSS_PLATFORM})" unless unknown.empty?
  unless RbConfig::CONFIG["ruby_version"] == "3.1.0" && RbConfig::CONFIG["host_os"].start_with?("linux")
    abort "platform_gem: run on the Debian 12 host (Ruby 3.1, Linux), which builds 3.1 itself and 3.3/3.4 in bin/stack's chroot"
  end
  abort "platform_gem: a release build only (ACEMQ_PROFILE is #{ENV['ACEMQ_PROFILE']})" if ENV.fetch("ACEMQ_PROFILE", "release") != "release"

  # Every build runs even when its .so exists: cargo makes one that is
  # current a no-op, and a stale one would otherwise ship unnoticed.
  glibc = PlatformGem::GLIBC_MAX
  if platforms.include?(PlatformGem::PLATFORM)
    PlatformGem::BUILDS.each do |abi, command|
      puts "platform_gem: Ruby #{abi}"
      sh(*command)
    end
    # --strip-unneeded keeps the dynamic symbol table (Init_acemq and what
    # libruby resolves at load) and drops the rest.
    builds = PlatformGem::BUILDS.keys.to_h do |abi|
      stripped = "#{PlatformGem.stage_dir}/#{PlatformGem::PLATFORM}.#{abi}.so"
      mkdir_p PlatformGem.stage_dir
      sh "strip", "--strip-unneeded", "-o", stripped, PlatformGem.so_path(abi)
      [abi, stripped]
    end
    _, glibc = PlatformGem.package(PlatformGem::PLATFORM, builds, glibc_max: PlatformGem::GLIBC_MAX)
  end
  if platforms.include?(PlatformGem::CROSS_PLATFORM)
    # No glibc symbol newer than the x86_64 gem's (or GLIBC_MAX when that
    # one is not built in this run).
    sh(*PlatformGem::CROSS_BUILD)
    builds = PlatformGem::BUILDS.keys.to_h { |abi| [abi, "#{PlatformGem::CROSS_LIB}/acemq/#{abi}/acemq.so"] }
    PlatformGem.package(PlatformGem::CROSS_PLATFORM, builds, glibc_max: glibc)
  end
end
