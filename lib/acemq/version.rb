# frozen_string_literal: true

module AceMQ
  VERSION = "0.1.0"
end
