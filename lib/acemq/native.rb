# frozen_string_literal: true

require "rbconfig"
require "acemq/errors"

begin
  # A checkout holds one build per Ruby ABI (rake compile); an installed gem
  # has the one it compiled at install time as acemq/acemq.
  abi = "acemq/#{RbConfig::CONFIG['ruby_version']}/acemq"
  if $LOAD_PATH.any? { |dir| File.exist?(File.join(dir, "#{abi}.#{RbConfig::CONFIG['DLEXT']}")) }
    require abi
  else
    require "acemq/acemq"
  end
rescue LoadError => e
  raise LoadError, "acemq: the native extension is not built (#{e.message}). " \
                   "In a checkout run `rake compile`; an installed gem builds it at install time."
end
