# frozen_string_literal: true

require "fileutils"
require "socket"
require "time"
require "tmpdir"

module Drill
  # A RabbitMQ node of the drill's own, so it can stop, restart and kill a
  # broker without touching the shared one on 5672: its own name, ports,
  # data and log directories, an empty plugins file, its own config file,
  # and its own HOME (so its Erlang cookie is one the drill made, shared
  # only with the rabbitmqctl calls below).
  #
  # The nodes of a cluster (drill/cluster.rb) are made with one cookie for
  # all of them: Erlang distribution lets two nodes (and rabbitmqctl) talk
  # only when their cookies match, so each node's HOME gets the same
  # .erlang.cookie.
  #
  # The scripts under /usr/lib/rabbitmq/bin are called directly: Debian's
  # /usr/sbin wrappers switch to the rabbitmq user, which would need the
  # directories chowned and would share that user's cookie.
  class Node
    BIN = %w[/usr/lib/rabbitmq/bin /usr/lib/rabbitmq/sbin].find { |d| File.executable?(File.join(d, "rabbitmqctl")) }
    # The node registers with epmd a moment after it is spawned; until
    # then await_startup fails at once, so it is asked again.
    START_LIMIT = 60
    CTL_LIMIT = 30

    attr_reader :name, :port, :dir, :stops

    # name: the node name (default acemq-drill-PID[-TAG]@localhost); cookie:
    # the Erlang cookie to share with other nodes (default: Erlang makes
    # one); config: more lines for its rabbitmq.conf (a TLS listener, its
    # ssl_options); tag: set apart the names of several nodes in one process.
    def initialize(name: nil, cookie: nil, config: [], tag: nil)
      @dir = Dir.mktmpdir("acemq-drill-node")
      @name = name || "acemq-drill-#{Process.pid}#{tag && "-#{tag}"}@localhost"
      @port = Node.free_port
      @dist_port = Node.free_port
      %w[mnesia log home].each { |d| FileUtils.mkdir_p(File.join(@dir, d)) }
      File.write(File.join(@dir, "enabled_plugins"), "")
      # Its own config file: the system one (/etc/rabbitmq/rabbitmq.conf)
      # names the shared broker's listener on 5672, which this node must
      # not try to take.
      File.write(File.join(@dir, "rabbitmq.conf"), ["listeners.tcp.default = 127.0.0.1:#{@port}", *config].join("\n") + "\n")
      write_cookie(cookie) if cookie
      @stops = []
    end

    def self.free_port
      s = TCPServer.new("127.0.0.1", 0)
      s.addr[1]
    ensure
      s&.close
    end

    def url = "amqp://guest:guest@127.0.0.1:#{@port}"

    def env
      { "HOME" => File.join(@dir, "home"), "RABBITMQ_NODENAME" => @name, "RABBITMQ_NODE_PORT" => @port.to_s,
        "RABBITMQ_DIST_PORT" => @dist_port.to_s, "RABBITMQ_MNESIA_BASE" => File.join(@dir, "mnesia"),
        "RABBITMQ_LOG_BASE" => File.join(@dir, "log"), "RABBITMQ_PID_FILE" => pid_file,
        "RABBITMQ_ENABLED_PLUGINS_FILE" => File.join(@dir, "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE" => File.join(@dir, "rabbitmq.conf") }
    end

    def pid_file = File.join(@dir, "node.pid")

    def beam_pid
      Integer(File.read(pid_file).strip)
    rescue Errno::ENOENT, ArgumentError
      nil
    end

    # Start (or start again on the same data directory) and wait until the
    # broker accepts connections. Returns the seconds it took.
    def start
      t = Drill.now
      raise Failure, "rabbitmq-server not found (looked in /usr/lib/rabbitmq/bin)" unless BIN

      # In the foreground, put in the background: RabbitMQ 4.3 no longer
      # starts with -detached, and this way works on every version. A
      # process group of its own keeps a Ctrl-C of the drill from reaching
      # it before destroy does; Process.detach reaps it when it exits.
      pid = spawn(env, File.join(BIN, "rabbitmq-server"), chdir: @dir, pgroup: true, in: File::NULL,
                                                          out: console_log, err: console_log)
      Process.detach(pid)

      Drill.eventually(START_LIMIT, "private node #{@name} to start (log: #{log_file})", interval: 0.25) do
        ctl_ok?("await_startup", "--timeout", "10")
      end
      Drill.eventually(10, "private node to listen on #{@port}") { Node.listening?(@port) }
      Drill.now - t
    end

    def self.listening?(port)
      TCPSocket.new("127.0.0.1", port).close
      true
    rescue SystemCallError
      false
    end

    def log_file = File.join(@dir, "log", "#{@name}.log")

    # What rabbitmq-server prints before its own log is open.
    def console_log = [File.join(@dir, "log", "console.log"), "a"]

    def stop_app = ctl!("stop_app")
    def start_app = ctl!("start_app")

    # kill -9 of the node's Erlang VM: what a crashed or OOM-killed broker is.
    def kill9
      pid = beam_pid or raise Failure, "no pid file for #{@name}"
      Process.kill("KILL", pid)
      Drill.eventually(10, "beam #{pid} to die") { !Drill.alive?(pid) }
      Drill.eventually(10, "port #{@port} to close") { !Node.listening?(@port) }
    end

    # Connections whose name starts with prefix: [[pid, name]].
    def connections(prefix)
      out = ctl!("list_connections", "--no-table-headers", "pid", "client_properties")
      out.lines.filter_map do |l|
        pid, props = l.chomp.split("\t", 2)
        name = props.to_s[/\{"connection_name","([^"]*)"\}/, 1]
        [pid, name] if name&.start_with?(prefix)
      end
    end

    # The broker closes every connection whose name starts with prefix, as
    # an operator or a failover would: all at once (one rabbitmqctl each, in
    # parallel, since each takes half a second to start). Returns
    # { connection name => wall time the broker closed it }, read from the
    # node's log: rabbitmqctl's own start-up makes the time it is called
    # half a second early.
    def close_connections(prefix)
      found = connections(prefix)
      found.map { |pid, _| Thread.new { ctl!("close_connection", pid, CLOSE_REASON) } }.each(&:value)
      Drill.eventually(10, "the node to log the closes") do
        times = closed_at
        found.all? { |pid, _| times[Node.local_pid(pid)] } && found.to_h { |pid, name| [name, times[Node.local_pid(pid)]] }
      end
    end

    # The node logs its own processes as <0.684.0>; list_connections names
    # the same one <node@host.creation.684.0>.
    def self.local_pid(pid) = pid.delete("<>").split(".").last(2).join(".")

    CLOSE_REASON = "drill: the broker closes this connection"

    # { local pid ("684.0") => wall time } for the closes the node has logged.
    def closed_at
      File.foreach(log_file).each_with_object({}) do |line, times|
        next unless line.include?("Closing connection <") && line.include?(CLOSE_REASON)

        times[Node.local_pid(line[/Closing connection <([^>]+)>/, 1])] = log_time(line)
      end
    end

    # Wall time of the first line matching pattern that the node logged
    # after wall time t, or nil.
    def logged_after(pattern, t)
      File.foreach(log_file) do |line|
        next unless line.match?(pattern)

        at = log_time(line)
        return at if at > t
      end
      nil
    end

    # When the node stopped and started taking connections, from its log.
    def listener_stopped_after(t) = logged_after(/stopped TCP listener on 127\.0\.0\.1:#{@port}\b/, t)
    def listener_started_after(t) = logged_after(/started TCP listener on 127\.0\.0\.1:#{@port}\b/, t)

    # "2026-12-01 10:56:47.036616+00:00 [info] ..." as epoch seconds.
    def log_time(line)
      Time.strptime(line[0, 32], "%Y-%m-%d %H:%M:%S.%N%:z").to_f
    end

    # Rows of list_queues for the given columns.
    def queues(*columns)
      ctl!("list_queues", "--no-table-headers", *columns).lines.map { |l| l.chomp.split("\t") }
    end

    # Stop and remove everything: rabbitmqctl stop, then kill -9 by the pid
    # file if it is still there.
    def destroy
      pid = beam_pid
      ctl_ok?("stop", limit: 20) if pid && Drill.alive?(pid)
      if pid && Drill.alive?(pid)
        Process.kill("KILL", pid)
        Drill.eventually(10, "beam #{pid} to die") { !Drill.alive?(pid) }
      end
    rescue Errno::ESRCH
      nil
    ensure
      FileUtils.rm_rf(@dir)
    end

    def ctl!(*args, limit: CTL_LIMIT)
      out, ok = ctl(*args, limit: limit)
      raise Failure, "rabbitmqctl -n #{@name} #{args.join(' ')} failed: #{out.strip}" unless ok

      out
    end

    def ctl_ok?(*args, limit: CTL_LIMIT) = ctl(*args, limit: limit)[1]

    # rabbitmq-queues (quorum_status, ...) against this node.
    def queues_ctl!(*args, limit: CTL_LIMIT)
      out, ok = ctl(*args, limit: limit, tool: "rabbitmq-queues")
      raise Failure, "rabbitmq-queues -n #{@name} #{args.join(' ')} failed: #{out.strip}" unless ok

      out
    end

    private

    # Erlang reads the cookie from $HOME/.erlang.cookie and refuses one that
    # others can read.
    def write_cookie(cookie)
      path = File.join(@dir, "home", ".erlang.cookie")
      File.write(path, cookie)
      File.chmod(0o400, path)
    end

    # rabbitmqctl (or another tool of BIN) with a time limit of its own
    # (`timeout`), quiet, tab-separated.
    def ctl(*args, limit:, tool: "rabbitmqctl")
      r, w = IO.pipe
      pid = spawn(env, "timeout", "-k", "2", limit.to_s, File.join(BIN, tool), "-n", @name, "-q",
                  *args, out: w, err: w, chdir: @dir)
      w.close
      out = r.read
      _, status = Process.wait2(pid)
      [out, status.success?]
    ensure
      r&.close
    end
  end
end
