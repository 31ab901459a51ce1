# frozen_string_literal: true

require "acemq/errors"

begin
  require "acemq/acemq"
rescue LoadError => e
  raise LoadError, "acemq: the native extension is not built (#{e.message}). " \
                   "In a checkout run `rake compile`; an installed gem builds it at install time."
end
