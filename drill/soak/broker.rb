# frozen_string_literal: true

require_relative "support"
require_relative "../node"

module Soak
  # The soak's private RabbitMQ node (Drill::Node: its own name, ports and
  # data; the shared broker on 5672 is never touched), set up so that every
  # refusal the soak needs is cheap to provoke:
  #
  # - max_message_size 1 MiB, so an oversized publish is a 1 MiB body, not
  #   RabbitMQ 3.x's default of 128 MiB;
  # - a user `soak` that may configure and read anything and write anything
  #   but the exchange `soak.denied`, which guest declares: a publish there
  #   is refused with ACCESS_REFUSED (403).
  class Broker
    USER = "soak"
    PASSWORD = "soak"
    DENIED = "soak.denied"
    MAX_MESSAGE_SIZE = 1_048_576

    attr_reader :node

    def initialize
      @node = Drill::Node.new(config: ["max_message_size = #{MAX_MESSAGE_SIZE}"])
    end

    # Start the node and set it up; the seconds it took.
    def start
      t = Soak.now
      @node.start
      @node.ctl!("add_user", USER, PASSWORD)
      @node.ctl!("set_permissions", "-p", "/", USER, ".*", "^(?!#{Regexp.escape(DENIED)}$).*", ".*")
      guest = AceMQ::AMQP::Connection.open(@node.url, origin: "soak-setup")
      begin
        AceMQ::AMQP::Topology.new.exchange(DENIED, type: :direct).apply(guest)
      ensure
        guest.close
      end
      Soak.now - t
    end

    def url = "amqp://#{USER}:#{PASSWORD}@127.0.0.1:#{@node.port}"
    def name = @node.name
    def port = @node.port

    # The channels the broker holds open for the connection named `origin`
    # (its connection_name), or nil when no such connection is listed.
    # rabbitmqctl: half a second or more a call, so asked before and after
    # a path, not inside it.
    def channels_of(origin)
      pids = @node.connections(origin).select { |_, n| n == origin }.map(&:first)
      return nil if pids.empty?

      rows = @node.ctl!("list_channels", "--no-table-headers", "connection").lines.map(&:strip)
      rows.count { |pid| pids.include?(pid) }
    end

    def destroy = @node.destroy
  end
end
