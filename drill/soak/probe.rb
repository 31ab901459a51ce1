# frozen_string_literal: true

require_relative "support"

module Soak
  # What the soak counts, in this process and on the broker.
  #
  # channels: channel ids the client holds on its AMQP connection
  #   (Connection#resources; 0 on memory://); broker: the channels the
  #   broker lists for this connection (rabbitmqctl list_channels, nil on
  #   memory://); fds: /proc/self/fd; threads: /proc/self/task (Ruby's,
  #   tokio's and lapin's); tasks: tokio tasks alive on the engine's
  #   runtime; rss_kb: VmRSS.
  Sample = Struct.new(:channels, :broker, :fds, :threads, :tasks, :rss_kb, keyword_init: true) do
    def rss_mb = rss_kb / 1024.0
  end

  # How far a resource may sit above its baseline once the path has settled,
  # and why. A leak per operation shows as hundreds or thousands after a
  # path's N operations, so none of these can hide one; they allow what
  # happens once.
  TOLERANCE = {
    # A channel is given back when its operation ends: exactly the baseline.
    # The broker's count for the connection must then be the client's,
    # exactly (checked apart: see TransportRun#judge).
    channels: 0,
    # Descriptors and threads are per connection and per runtime, never per
    # operation: exactly the baseline is expected, and 2 allow a descriptor
    # or thread that Ruby or glibc open once, lazily, the first time a path
    # needs them.
    fds: 2,
    threads: 2,
    # A task ends when its operation does; a cancelled subscription's task
    # lives on for its last second, which the settle wait covers. 2 allow a
    # task started once, lazily, by the first operation of its kind.
    tasks: 2
  }.freeze

  # How long a path may take to give its resources back before it is judged:
  # tokio keeps an idle blocking thread for 10 s, and a cancelled
  # subscription's task ends about 1 s after the cancel.
  SETTLE = 15
  # The broker closes a channel the client gave back a round trip later.
  BROKER_SETTLE = 10

  class Probe
    attr_reader :origin

    def initialize(mq, origin:, broker: nil)
      @mq = mq
      @origin = origin
      @broker = broker
      @connection_pid = nil
    end

    # The broker's pid of this connection (looked up once: a later lookup
    # that differs means the connection was lost and dialled again).
    def connection_pid
      return nil unless @broker

      @connection_pid ||= current_connection_pid
    end

    def current_connection_pid
      @broker.node.connections(@origin).find { |_, n| n == @origin }&.first
    end

    def sample(broker: true)
      r = @mq.resources
      Sample.new(channels: r.channels, broker: broker ? broker_channels : nil, fds: Probe.fds, threads: Probe.threads,
                 tasks: r.tasks, rss_kb: Probe.rss_kb)
    end

    def broker_channels
      return nil unless @broker

      pid = connection_pid or return nil
      @broker.node.ctl!("list_channels", "--no-table-headers", "connection").lines.count { |l| l.strip == pid }
    end

    # When the connection was dialled again (the engine replaces a
    # connection lapin can open no channel on): [old pid, new pid], and the
    # probe counts the new one's channels from now on. nil when it is the
    # one it was.
    def replaced
      now = current_connection_pid
      return nil if now.nil? || now == @connection_pid

      was = @connection_pid
      @connection_pid = now
      [was, now]
    end

    def self.fds = Dir.children("/proc/self/fd").size
    def self.threads = Dir.children("/proc/self/task").size
    def self.rss_kb = File.read("/proc/self/status")[/^VmRSS:\s+(\d+)/, 1].to_i

    # Wait (up to SETTLE) until every resource of this process is within
    # its tolerance of base, then (up to BROKER_SETTLE) until the broker
    # lists as many channels for the connection as the client holds; the
    # sample then (or the last one), and the seconds it took.
    def settle(base)
      t = Soak.now
      GC.start
      s = Soak.poll(SETTLE, interval: 0.1) do
        x = sample(broker: false)
        Probe.excess(x, base, LOCAL).empty? && x
      end || sample(broker: false)
      if @broker
        # Both counts read together on each poll: the client's may still
        # fall (a retired publishing channel closes a second after its last
        # nack, docs/lifecycle.md), and a count read before the broker's
        # poll began would be compared with the broker's after it (CI saw
        # 5 held against 2 listed, the 5 read while 3 retired ones lingered).
        both = Soak.poll(BROKER_SETTLE, interval: 0.2) do
          c = @mq.resources.channels
          n = broker_channels
          n == c && [c, n]
        end || [@mq.resources.channels, broker_channels]
        s.channels, s.broker = both
      end
      GC.start
      s.rss_kb = Probe.rss_kb
      [s, Soak.now - t]
    end

    LOCAL = %i[channels fds threads tasks].freeze

    # { resource => [before, after] } for those above tolerance.
    def self.excess(after, before, keys = TOLERANCE.keys)
      keys.each_with_object({}) do |k, out|
        a = after[k]
        b = before[k]
        next if a.nil? || b.nil?

        out[k] = [b, a] if a > b + TOLERANCE[k]
      end
    end
  end
end
