# frozen_string_literal: true

require "acemq/amqp/result"

module AceMQ
  module AMQP
    module Delays
      # One level of the delay cascade that holds something
      # (Connection#delayed): level (0 first), queue, seconds (what the
      # level holds a message for) and waiting.
      class Level < Result
        fields :level, :queue, :seconds, :waiting, as: "level",
               returned_by: "Connection#delayed returns Delays::Level objects"
      end
    end
  end
end
