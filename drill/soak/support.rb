# frozen_string_literal: true

$LOAD_PATH.unshift(File.expand_path("../../lib", __dir__))
require "acemq/amqp"
require "securerandom"
require "set"

# What drill/node.rb needs (Drill.eventually, Drill.alive?), without what
# drill/support.rb loads for the other drills: the soak measures its own
# process's threads and descriptors, and every library loaded is a baseline
# to explain.
require_relative "../wait"

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
