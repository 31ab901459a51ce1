# frozen_string_literal: true

require "open3"
require_relative "node"

module Drill
  # Network namespaces of the drill's own (`ip netns`, veth, a bridge), so a
  # broker can sit behind a link the drill takes down, and the only way
  # between the clients and it is the drill's proxy or that link.
  #
  # Every name carries PREFIX and the drill's pid: a run killed before its
  # cleanup leaves names whose pid is dead, and the next run deletes them
  # (Net.sweep) before it makes its own.
  module Net
    PREFIX = "acemqnet"

    class Error < Failure; end

    def self.ip!(*args)
      out, status = Open3.capture2e("ip", *args)
      raise Error, "ip #{args.join(' ')}: #{out.strip}" unless status.success?

      out
    end

    def self.ip?(*args) = Open3.capture2e("ip", *args)[1].success?

    # Whether this machine lets us make namespaces (root, iproute2 present).
    def self.available?
      name = "#{PREFIX}-probe-#{Process.pid}"
      ip?("netns", "add", name) && ip?("netns", "del", name)
    rescue Errno::ENOENT
      false
    end

    # Remove what earlier runs left: namespaces (and the processes still in
    # them, a broker and its epmd) and root-side links whose pid is dead.
    def self.sweep
      ip!("netns", "list").lines.map { |l| l.split.first }.compact.each do |ns|
        pid = ns[/\A#{PREFIX}-(\d+)-/o, 1] or next
        Namespace.new(ns).destroy unless Drill.alive?(Integer(pid))
      end
      ip!("-o", "link", "show").lines.each do |l|
        dev = l[/\A\d+: (an\d+[a-z]\d*)[@:]/, 1] or next
        ip?("link", "del", dev) unless Drill.alive?(Integer(dev[/\d+/]))
      end
    end

    # A /24 of 10.231.0.0/16 for this run, from its pid, so two runs on one
    # machine (the host's and a chroot's, say) rarely share one.
    def self.subnet(offset = 0) = "10.#{231 + offset}.#{Process.pid % 250 + 1}"

    # One named network namespace with its loopback up.
    class Namespace
      attr_reader :name

      def initialize(name)
        @name = name
      end

      def create
        Net.ip!("netns", "add", @name)
        exec!("ip", "link", "set", "lo", "up")
        self
      end

      def exec!(*cmd)
        out, status = Open3.capture2e(*prefix, *cmd)
        raise Error, "in #{@name}: #{cmd.join(' ')}: #{out.strip}" unless status.success?

        out
      end

      # nsenter, not `ip netns exec`: that one also makes / a slave mount,
      # which fails where / is not a mount point (bin/stack's chroots:
      # "mount --make-rslave /" failed: Invalid argument). Only the network
      # namespace is needed.
      def prefix = ["nsenter", "--net=/run/netns/#{@name}"]

      # Kill what still runs inside (the drill started all of it: a node,
      # its epmd), then delete the namespace.
      def destroy
        pids = Open3.capture2e("ip", "netns", "pids", @name)[0].split.map(&:to_i)
        pids.each do |pid|
          Process.kill("KILL", pid)
        rescue Errno::ESRCH
          nil
        end
        Net.ip?("netns", "del", @name)
      end
    end

    # A veth pair from the root namespace (host end `host`, address .1) into
    # ns (end `peer`, address addr), or onto a bridge when bridge is given.
    def self.veth(host, ns, addr, host_addr: nil, bridge: nil)
      ip!("link", "add", host, "type", "veth", "peer", "name", "#{host}p")
      ip!("link", "set", "#{host}p", "netns", ns.name)
      ns.exec!("ip", "addr", "add", "#{addr}/24", "dev", "#{host}p")
      ns.exec!("ip", "link", "set", "#{host}p", "up")
      ip!("addr", "add", "#{host_addr}/24", "dev", host) if host_addr
      ip!("link", "set", host, "master", bridge) if bridge
      ip!("link", "set", host, "up")
    end
  end

  # A Drill::Node run inside a network namespace, reached at its address
  # there. rabbitmq-server and every rabbitmqctl call are started through
  # nsenter into its namespace, so the node, its epmd and the CLI meet
  # inside.
  class NetNode < Node
    # Each node has its namespace's address to itself: the usual port.
    PORT = 5672

    attr_reader :ip, :netns

    # guest may only log in over loopback by default; the drill's clients
    # come over the veth (and through the proxy), from another address.
    def initialize(netns:, ip:, name: nil, cookie: nil, config: [], tag: nil, longname: false)
      @netns = netns
      @ip = ip
      @longname = longname
      super(name: name, cookie: cookie, tag: tag, config: ["listeners.tcp.veth = #{ip}:#{PORT}", "loopback_users = none", *config])
      File.write(File.join(@dir, "rabbitmq-env.conf"), "")
      @port = PORT
    end

    def url = "amqp://guest:guest@#{@ip}:#{@port}"

    def env
      e = super
      # Not the system's rabbitmq-env.conf: the host's binds epmd and
      # Erlang distribution to 127.0.0.1 (ERL_EPMD_ADDRESS, ERL_FLAGS
      # inet_dist_use_interface), which no node in another namespace can
      # reach; an empty one of the node's own.
      e["RABBITMQ_CONF_ENV_FILE"] = File.join(@dir, "rabbitmq-env.conf")
      # Erlang distribution across namespaces: nodes named by address.
      e["RABBITMQ_USE_LONGNAME"] = "true" if @longname
      e
    end

    def start
      t = Drill.now
      pid = spawn(env, File.join(BIN, "rabbitmq-server"), chdir: @dir, pgroup: true, in: File::NULL,
                                                          out: console_log, err: console_log)
      Process.detach(pid)
      Drill.eventually(START_LIMIT, "node #{@name} in #{@netns.name} to start (log: #{log_file})", interval: 0.25) do
        ctl_ok?("await_startup", "--timeout", "10")
      end
      Drill.eventually(10, "node to listen on #{@ip}:#{@port}") { reachable? }
      Drill.now - t
    end

    def reachable?
      Socket.tcp(@ip, @port, connect_timeout: 0.5).close
      true
    rescue SystemCallError
      false
    end

    private

    # Everything Node starts (the server, rabbitmqctl) starts in the
    # namespace.
    def spawn(env, *cmd, **opts) = super(env, *@netns.prefix, *cmd, **opts)
  end
end
