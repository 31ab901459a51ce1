# frozen_string_literal: true

# `rake drill:net`: a private RabbitMQ node in a network namespace of its
# own, reached over a veth pair, and the runners in the root namespace
# dialling it through the drill's fault-injecting proxy (drill/proxy.rb):
#
#   half-open   every connection goes silent with no FIN or RST; the
#               heartbeat must find it, the consumers come back through the
#               proxy on new connections
#   latency     50–200 ms a chunk each way, and a connection reset every
#               few seconds; throughput against the same batch at no latency
#
# then the accounting of rake drill: nothing lost, nothing charged twice.
#
#   ruby drill/net.rb
#   DRILL_PHASES=half-open ruby drill/net.rb
#
# Needs root and iproute2 (`ip netns`). Exits 0 when every phase passed.
require_relative "run"
require_relative "netns"
require_relative "proxy"

module Drill
  # What the network phases share: a proxy in front of the namespaced node,
  # and which runner owns a proxied connection.
  class NetPhase < Phase
    private

    def proxy
      @proxy ||= FaultProxy.new(node.ip, node.port).start
    end

    # The runner whose socket is the client end of link: the proxy sees the
    # client's port, ss says which process holds it.
    def owner(link)
      port = link.client.remote_address.ip_port
      out = IO.popen(["ss", "-Htnp", "state", "established", "( sport = :#{port} )"], err: File::NULL, &:read)
      pid = out[/pid=(\d+)/, 1]&.to_i
      @runners.find { |r| r.pid == pid }
    rescue IOError, SystemCallError
      nil
    end

    # Seconds from wall time t to runner r charging an order first
    # published after t: a message that came through its new connection.
    # (Its next charge proves nothing: it may have been handed out before t.)
    def await_resumed(t, r, limit: 30)
      Drill.eventually(limit, "runner #{r.pid} to charge an order published after #{format('%.3f', t)}") do
        sent = publisher.first_attempt
        first = runs([r]).select { |_, _, order, _| sent.fetch(order, 0) > t }.map { |_, c, _, _| c }.min
        first && first - t
      end
    rescue Failure => e
      fail!("#{e.message}; runner #{r.pid}: #{r.text.lines.last(6).map(&:strip).join(' / ')}")
    end

    def teardown
      super
      @proxy&.close
    end
  end

  # The broker's side vanishes without a FIN: every connection through the
  # proxy is held open and silent (a NAT or firewall that dropped its
  # state, a host that lost power). Only the AMQP heartbeat can tell; the
  # runners must find out within two intervals, connect again (new
  # connections pass) and subscribe again, and what the held consumers had
  # been given comes back when the broker finds out in turn.
  class HalfOpen < NetPhase
    TITLE = "net: half-open connections"
    HEARTBEAT = 2
    MESSAGES = 1500
    RUNNERS = 2
    RATE = 100
    ROUNDS = 2

    def run
      queue = "drill-#{tag}-halfopen"
      origin = "drill-#{tag}-halfopen"
      charges, keys = db.charge_tables("drill_#{tag}_halfopen")
      declare(AceMQ::AMQP::Topology.new.queue(queue))
      RUNNERS.times do |i|
        spawn_runner(runner_env(queue: queue, origin: "#{origin}-#{i}", charges: charges, keys: keys,
                                extra: { "AMQP_URL" => proxy.url, "HEARTBEAT" => HEARTBEAT.to_s }))
      end
      @runners.each(&:await_running)

      all = orders("H", MESSAGES)
      result.messages = all.size
      t0 = Drill.now
      # The publisher dials the node directly, over the veth: the fault is
      # the consumers'.
      feed = publisher.pace(all, to: queue, rate: RATE, deadline: Drill.now + 90)
      found = []
      backs = []
      held = 0
      ROUNDS.times do |k|
        at(t0, 2 + 8 * k, feed)
        owners = proxy.live.to_h { |l| [l, owner(l)] }
        wall = Time.now.to_f
        links = proxy.blackhole!
        fail!("no connection through the proxy to hold") if links.empty?
        held += links.size
        # Each client end closing its socket is the client finding out.
        Drill.eventually(10 * HEARTBEAT, "every held connection to be given up by its client") do
          links.all?(&:client_gone)
        end
        found.concat(links.map { |l| l.client_gone - l.held_at })
        owners.values.compact.uniq.each { |r| backs << await_resumed(wall, r) }
      end
      result.faults = held
      publisher.hurry
      join(feed, 90, "publishing")
      await_charged(charges, all, queue)
      settle(queue)
      account(charges, all, queue)
      broker = proxy.links.select(&:held?).filter_map { |l| l.broker_gone && l.broker_gone - l.held_at }
      result.recovery = "heartbeat #{HEARTBEAT}s: client found it #{seconds(found)}, broker #{seconds(broker)}; " \
                        "silence to a new message charged #{seconds(backs)}"
      result.worst = backs.max
      said = @runners.sum { |r| r.text.scan("stopped sending heartbeats").size }
      result.notes = "#{held} connections held in #{ROUNDS} rounds, #{reruns} re-run, #{said} heartbeat errors logged"
      stop_runners
    end
  end

  # 50–200 ms of jittered latency each way and a reset every few seconds:
  # the same batch consumed first with the proxy passing, then with the
  # faults, throughput compared. A higher prefetch than the default: with a
  # quarter of a second between a delivery and its ack, a consumer that
  # holds four deliveries handles at most about sixteen a second.
  class Latency < NetPhase
    TITLE = "net: latency and resets"
    MESSAGES = 1000
    RUNNERS = 2
    PREFETCH = 20
    LATENCY = [0.05, 0.2].freeze
    RESET_EVERY = 2.5

    def run
      queue = "drill-#{tag}-latency"
      origin = "drill-#{tag}-latency"
      charges, keys = db.charge_tables("drill_#{tag}_latency")
      declare(AceMQ::AMQP::Topology.new.queue(queue))
      RUNNERS.times do |i|
        spawn_runner(runner_env(queue: queue, origin: "#{origin}-#{i}", charges: charges, keys: keys,
                                extra: { "AMQP_URL" => proxy.url, "PREFETCH" => PREFETCH.to_s }))
      end
      @runners.each(&:await_running)

      plain = orders("L0", MESSAGES)
      faulty = orders("L1", MESSAGES)
      result.messages = plain.size + faulty.size
      base = batch(plain, queue, charges)
      proxy.latency!(*LATENCY, rng: rng)
      resets = []
      resetting = Thread.new do
        Thread.current.report_on_exception = false
        loop do
          sleep RESET_EVERY
          link = proxy.busy(rng: rng) or next
          r = owner(link)
          wall = Time.now.to_f
          proxy.reset!(link)
          resets << [r, wall]
        end
      end
      slow = batch(faulty, queue, charges, before: plain)
      resetting.kill.join
      done = Time.now.to_f
      proxy.pass!
      result.faults = resets.size
      settle(queue)
      account(charges, plain + faulty, queue)
      # Per reset of a runner's consuming connection, until it logged that
      # it subscribed again (a reset after the batch was done is left out:
      # its runner may be stopped before it does).
      backs = resets.filter_map { |r, wall| r && wall < done - 5 && resubscribed(r, wall) }
      result.recovery = "reset to subscribed again #{seconds(backs)}"
      result.worst = backs.max
      result.notes = format("%d msg/s with no latency, %d msg/s with %d–%d ms and %d resets (%.0f%%); prefetch %d; " \
                            "%d re-run", base, slow, LATENCY[0] * 1000, LATENCY[1] * 1000, resets.size,
                            100.0 * slow / base, PREFETCH, reruns)
      stop_runners
    end

    private

    # Seconds from wall time t to r logging that it subscribed again.
    def resubscribed(r, t)
      Drill.eventually(30, "runner #{r.pid} to subscribe again after a reset") do
        r.text.lines.grep(/subscribed again/).map { |l| Time.parse(l[/\[(\S+)/, 1]).to_f }.find { |x| x > t }&.-(t)
      end
    end

    # Publish the orders at once (directly), wait until all are charged:
    # messages a second from the first publish to the last charge.
    def batch(list, queue, charges, before: [])
      t = Drill.now
      list.each { |o| publisher.publish({ "order_id" => o }, to: queue, deadline: Drill.now + 60) }
      await_charged(charges, before + list, queue, limit: 120)
      list.size / (Drill.now - t)
    end
  end

  # The namespace, its veth and the node in it, made and removed around the
  # phases.
  class NetLab
    attr_reader :node, :ns

    def initialize
      Net.sweep
      sub = Net.subnet
      @ns = Net::Namespace.new("#{Net::PREFIX}-#{Process.pid}-broker").create
      Net.veth("an#{Process.pid}b", @ns, "#{sub}.2", host_addr: "#{sub}.1")
      @node = NetNode.new(netns: @ns, ip: "#{sub}.2")
    end

    def destroy
      @node&.destroy
    ensure
      @ns.destroy
      Net.ip?("link", "del", "an#{Process.pid}b")
    end
  end

  NET_PHASES = { "half-open" => HalfOpen, "latency" => Latency }.freeze

  def self.net_main
    $stdout.sync = true
    unless Net.available?
      say "drill:net: cannot make a network namespace here (root and iproute2 needed)"
      return 1
    end
    names = ENV.fetch("DRILL_PHASES", NET_PHASES.keys.join(",")).split(",").map(&:strip)
    unknown = names - NET_PHASES.keys
    abort "drill:net: unknown phase(s) #{unknown.join(', ')}: choose from #{NET_PHASES.keys.join(', ')}" unless unknown.empty?

    seed = Integer(ENV.fetch("DRILL_SEED", Random.new_seed % 100_000))
    t0 = now
    results = []
    failure = bounded("drill:net", Float(ENV.fetch("DRILL_LIMIT", "240"))) do |made|
      lab = made[:broker] = NetLab.new
      say "drill:net: seed #{seed}; private node #{lab.node.name} at #{lab.node.ip}:#{lab.node.port} in namespace " \
          "#{lab.ns.name}; clients through the proxy in the root namespace"
      say format("drill:net: node up in %.1fs", lab.node.start)
      db = made[:db] = Database.new
      rng = Random.new(seed)
      tag = "#{Process.pid}#{SecureRandom.hex(2)}"
      names.each do |name|
        r = NET_PHASES.fetch(name).new(node: lab.node, db: db, rng: rng, tag: tag).call
        results << r
        say line(r)
      end
    end
    if failure
      results << failure
      say "drill:net: #{failure.failure}"
    end
    summary(results, now - t0, seed)
    results.all?(&:ok?) && results.size == names.size ? 0 : 1
  end
end

exit Drill.net_main if $PROGRAM_NAME == __FILE__
