# frozen_string_literal: true

require "open3"
require "timeout"

module AceMQ
  class Status
    # Unacknowledged counts from `rabbitmqctl list_queues`. AMQP cannot say
    # how many messages are delivered and not yet settled (a passive declare
    # gives ready and consumers only), and the management plugin, which
    # could, is often not enabled (it is not on the broker these specs use).
    # rabbitmqctl talks to the node over Erlang distribution, so it works
    # where the node is local and the cookie is readable; anywhere else the
    # status shows "—" for unacked rather than guessing.
    class Rabbitmqctl
      FIELDS = %w[name messages_ready messages_unacknowledged consumers].freeze

      # command: the program and its arguments (e.g. ["rabbitmqctl", "-n",
      # "rabbit@db1"]); vhost: the AMQP URL's.
      def initialize(command, vhost: "/", timeout: 10)
        @command = command
        @vhost = vhost
        @timeout = timeout
      end

      def to_s = @command.join(" ")

      # { queue name => { ready:, unacked:, consumers: } }, or raise
      # Unavailable with the reason.
      def list_queues
        argv = [*@command, "-q", "list_queues", "-p", @vhost, "--no-table-headers", *FIELDS]
        out, err, status = run(argv)
        unless status.success?
          raise Unavailable, err.strip.empty? ? "exit #{status.exitstatus}" : err.strip.lines.first.strip
        end

        out.each_line.each_with_object({}) do |line, all|
          name, ready, unacked, consumers = line.chomp.split("\t")
          next unless consumers

          all[name] = { ready: Integer(ready, exception: false), unacked: Integer(unacked, exception: false),
                        consumers: Integer(consumers, exception: false) }
        end
      end

      # The broker at host is one rabbitmqctl on this machine can reach
      # without being told a node name.
      def self.local?(host)
        ["localhost", "127.0.0.1", "::1", "[::1]"].include?(host.to_s.downcase)
      end

      class Unavailable < StandardError; end

      private

      def run(argv)
        Open3.popen3(*argv) do |stdin, stdout, stderr, wait|
          stdin.close
          out = Thread.new { stdout.read }
          err = Thread.new { stderr.read }
          unless wait.join(@timeout)
            Process.kill("KILL", wait.pid)
            raise Unavailable, "no answer within #{@timeout}s"
          end
          [out.value, err.value, wait.value]
        end
      rescue SystemCallError => e
        raise Unavailable, e.message
      end
    end
  end
end
