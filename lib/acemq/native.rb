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
  require "acemq/native_load"
  checkout = File.exist?(File.expand_path("../../Cargo.toml", __dir__))
  raise LoadError, "acemq: #{AceMQ::NativeLoad.message(e.message, dir: __dir__, checkout: checkout)}"
end
