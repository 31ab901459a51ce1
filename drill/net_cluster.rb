# frozen_string_literal: true

# `rake drill:net_cluster`: drill:cluster with the leader's node cut off
# rather than killed. Each of three private nodes runs in a network
# namespace of its own, on a bridge in the root namespace where the
# publishers and runners are; the quorum queue's leader is cut off by
# taking its link down (`ip link set … down`): no FIN, no RST, the node
# still running on the far side. The clients ask for a 2 s heartbeat, which
# is how one connected to the cut node finds out. Later the link comes back
# up and the node must be a follower of the queue again.
#
#   ruby drill/net_cluster.rb
#
# Needs root and iproute2. Exits 0 when it passed, 1 otherwise.
require_relative "cluster"
require_relative "netns"

module Drill
  # Cluster (drill/cluster.rb) on a bridge. Its kill9 and restart are the
  # fault and the repair LeaderKill calls: here the link goes down and up.
  class NetCluster < Cluster
    def initialize
      Net.sweep
      @down = []
      @spaces = []
      @devs = []
      @nodes = []
      @bridge = "an#{Process.pid}br"
      sub = Net.subnet(1)
      Net.ip!("link", "add", @bridge, "type", "bridge")
      Net.ip!("addr", "add", "#{sub}.1/24", "dev", @bridge)
      Net.ip!("link", "set", @bridge, "up")
      cookie = SecureRandom.hex(20)
      SIZE.times do |i|
        ns = Net::Namespace.new("#{Net::PREFIX}-#{Process.pid}-node#{i + 1}").create
        @spaces << ns
        dev = "an#{Process.pid}c#{i + 1}"
        ip = "#{sub}.#{11 + i}"
        Net.veth(dev, ns, ip, bridge: @bridge)
        @devs << dev
        # Named by address: the nodes resolve each other with no /etc/hosts.
        @nodes << NetNode.new(netns: ns, ip: ip, name: "acemq-net-#{Process.pid}-#{i + 1}@#{ip}", cookie: cookie,
                              longname: true, config: NetCluster.partition_config)
      end
    rescue StandardError
      destroy
      raise
    end

    # RabbitMQ 3.x decides what a partitioned node does with
    # cluster_partition_handling; its default, ignore, leaves the cluster
    # split after the link is back until someone restarts a node.
    # pause_minority (RabbitMQ's advice for three nodes) pauses the cut-off
    # node and resumes it when it sees the others. 4.x keeps its metadata
    # in Raft (Khepri) and needs no setting.
    #
    # net_ticktime: how long a node waits before it gives up on a silent
    # one (60 s by default; declared down after 45–75 s). On 3.10 a
    # consumer that must subscribe again while the cut node still counts
    # as up may get no answer until then (seen: 60 s); 15 s keeps the drill
    # short, and is what docs/production.md says to weigh.
    def self.partition_config
      version = Dir.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*").map { |d| d[/(\d+)\.\d+\.\d+\z/, 1].to_i }.max
      ["net_ticktime = #{NET_TICKTIME}", *(version && version < 4 ? ["cluster_partition_handling = pause_minority"] : [])]
    end

    NET_TICKTIME = 15

    # Every client asks for a short heartbeat (in the URL, which wins over
    # the option): it is how a runner or publisher connected to the cut
    # node finds out. With the broker's 60 s, a publisher there waited for
    # confirms on a connection that still looked open until the drill's
    # deadline (seen).
    def urls(first = 0) = super.map { |u| "#{u}?heartbeat=#{HEARTBEAT}" }

    HEARTBEAT = 2

    def dev(node) = @devs.fetch(@nodes.index(node))

    # The fault: node's link goes down; node keeps running, alone.
    def kill9(node)
      @cut_at = Drill.now
      Net.ip!("link", "set", dev(node), "down")
      @down << node
    end

    attr_reader :cut_at

    # The repair: the link comes back up. Returns the seconds it was down.
    def restart(node)
      Net.ip!("link", "set", dev(node), "up")
      @down.delete(node)
      Drill.now - @cut_at
    end

    def destroy
      super
    ensure
      @spaces.each(&:destroy)
      (@devs + [@bridge]).each { |d| Net.ip?("link", "del", d) }
    end
  end

  # LeaderKill with a cut for the kill, and a longer feed.
  class LeaderCut < LeaderKill
    TITLE = "cluster: cut the leader's link"
    # Per publisher, 30 s of publishing, the cut at 5 s: room for the
    # runner on the cut node to find out (two heartbeats), and to subscribe
    # again once the others have given up on the node (net_ticktime).
    MESSAGES = 1200
    RATE = 40
    RESUME_LIMIT = 30
  end

  def self.net_cluster_main
    $stdout.sync = true
    unless Net.available?
      say "drill:net_cluster: cannot make a network namespace here (root and iproute2 needed)"
      return 1
    end
    t0 = now
    cluster = nil
    phase = nil
    result = nil
    failure = bounded("drill:net_cluster", Float(ENV.fetch("DRILL_LIMIT", "300"))) do |made|
      cluster = made[:broker] = NetCluster.new
      say "drill:net_cluster: #{Cluster::SIZE} private nodes, each in a namespace on a bridge: " \
          "#{cluster.nodes.map(&:name).join(', ')}; client heartbeat #{NetCluster::HEARTBEAT}s, net_ticktime #{NetCluster::NET_TICKTIME}s"
      say format("drill:net_cluster: cluster of %d up in %.1fs", Cluster::SIZE, cluster.start)
      db = made[:db] = Database.new
      phase = LeaderCut.new(node: cluster, db: db, rng: Random.new, tag: "#{Process.pid}#{SecureRandom.hex(2)}")
      result = phase.call
    end
    result = failure if failure
    # drill:cluster's report; there "kill" reads "link down" and "restart"
    # "link up".
    report(cluster, phase&.figures, result, now - t0)
    result.ok? ? 0 : 1
  end
end

exit Drill.net_cluster_main if $PROGRAM_NAME == __FILE__
