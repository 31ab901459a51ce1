# frozen_string_literal: true

module AceMQ
  module AMQP
    # Core's restart rule for one supervised thing (the extension's, and the
    # runner's for its consumers): at most max_restarts within window
    # seconds, each after a pause doubling from 1 s to 30 s. The
    # --processes parent keeps one per worker process.
    #
    #   budget = AceMQ::AMQP::RestartBudget.new(max_restarts: 5, window: 300)
    #   pause = budget.spend # seconds to wait before restarting, nil: give up
    #
    # Starts no engine runtime: a process that forks may hold one.
    class RestartBudget
      # nil for core's defaults (NativeSupervisor::RESTART_DEFAULTS).
      def self.new(max_restarts: nil, window: nil) = _new({ max_restarts: max_restarts, window: window })

      def inspect = "#<#{self.class.name} #{recent}/#{max_restarts} within #{window}s, #{total} in all>"
    end
  end
end
