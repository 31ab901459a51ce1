# frozen_string_literal: true

$LOAD_PATH.unshift(File.expand_path("../../lib", __dir__))
require "acemq/amqp"
require "securerandom"
require "set"

# What drill/node.rb needs from the drills' support (drill/support.rb), without
# what that file loads for the other drills (PostgreSQL, Bunny, the runner
# helpers): the soak measures its own process's threads and descriptors, and
# every library loaded is a baseline to explain.
module Drill
  class Failure < StandardError; end unless const_defined?(:Failure)

  unless respond_to?(:eventually)
    def self.now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # Poll until the block returns truthy; raise Failure naming what was
    # awaited after limit seconds.
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
end

module Soak
  def self.now = Drill.now

  # Poll until the block returns truthy or limit seconds pass; the last value
  # either way (never raises: the caller reports what it found).
  def self.poll(limit, interval: 0.05)
    deadline = now + limit
    loop do
      value = yield
      return value if value || now > deadline

      sleep interval
    end
  end

  def self.say(line = "") = $stdout.puts(line)

  # A name no earlier run used, under the soak's prefix.
  def self.name(what) = "soak.#{what}.#{SecureRandom.hex(4)}"
end
