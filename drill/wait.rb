# frozen_string_literal: true

# The drills' and the soak's bounded waits, with nothing else loaded: the
# soak (drill/soak.rb) counts its own process's threads and descriptors, so
# it cannot load what drill/support.rb loads for the other drills (PostgreSQL,
# Bunny, the runner helpers).
module Drill
  # A phase that lost or doubled something, or a wait that ran out.
  class Failure < StandardError; end

  def self.now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # Poll until the block returns truthy; raise Failure naming what was
  # awaited after limit seconds. Every wait in the drill goes through here.
  def self.eventually(limit, what, interval: 0.05)
    deadline = now + limit
    loop do
      value = yield
      return value if value
      raise Failure, "timed out after #{limit}s waiting for #{what}" if now > deadline

      sleep interval
    end
  end

  def self.alive?(pid)
    Process.kill(0, pid)
    true
  rescue Errno::ESRCH
    false
  rescue Errno::EPERM
    true
  end
end
