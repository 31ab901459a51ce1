# frozen_string_literal: true

require "rbconfig"
require "acemq/errors"

begin
  # A checkout and the precompiled (x86_64-linux, aarch64-linux) gems hold one build per Ruby
  # ABI at acemq/<ruby_version>/acemq.so (rake compile, rake platform_gem);
  # the source gem has the one it compiled at install time as acemq/acemq.
  # A gem cross-compiled by rb-sys-dock (rake-compiler's layout) has them at
  # acemq/<major.minor>/acemq.so instead: docs/releasing.md.
  abis = ["acemq/#{RbConfig::CONFIG['ruby_version']}/acemq", "acemq/#{RUBY_VERSION[/\A\d+\.\d+/]}/acemq"]
  abi = abis.find { |name| $LOAD_PATH.any? { |dir| File.exist?(File.join(dir, "#{name}.#{RbConfig::CONFIG['DLEXT']}")) } }
  require abi || "acemq/acemq"
rescue LoadError => e
  dlext = RbConfig::CONFIG["DLEXT"]
  builds = Dir[File.join(__dir__, "*", "acemq.#{dlext}")].map { |so| File.basename(File.dirname(so))[/\A\d+\.\d+/] }.sort
  source_gem = "install the source gem, which compiles the extension (Rust 1.85+, libclang and Ruby's headers): " \
               "`gem install acemq --platform ruby`, or in a Bundler app " \
               "`bundle config set force_ruby_platform true` before `bundle install`."
  message =
    if File.exist?(File.expand_path("../../Cargo.toml", __dir__))
      # A checkout (or the source gem, whose extconf.rb builds at install).
      "the native extension is not built for Ruby #{RUBY_VERSION} (#{e.message}). " \
        "In a checkout run `rake compile`; the source gem builds it at install time (`gem pristine acemq` builds it again)."
    elsif builds.empty?
      "the native extension is missing (#{e.message}). Reinstall acemq."
    elsif !builds.include?(RUBY_VERSION[/\A\d+\.\d+/])
      # RubyGems and Bundler choose the source gem for such a Ruby by the
      # platform gem's required_ruby_version; this is reached when that was
      # skipped (--force, --ignore-dependencies, an unpacked gem).
      "this precompiled acemq gem has builds for Ruby " \
        "#{builds.join(', ')}, not for #{RUBY_VERSION}. To use acemq on this Ruby, #{source_gem}"
    else
      # The build is there and did not load: another libc (musl), a glibc
      # older than the one it was linked against, or another CPU.
      "the precompiled extension for Ruby #{RUBY_VERSION} did not load (#{e.message}). " \
        "It is built for Linux on x86_64 and aarch64 with glibc 2.34 or newer; elsewhere (musl, Alpine, an older glibc), #{source_gem}"
    end
  raise LoadError, "acemq: #{message}"
end
