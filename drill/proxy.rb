# frozen_string_literal: true

require "socket"

module Drill
  # The drill's fault-injecting TCP proxy: clients dial it, it dials the
  # broker, and what it forwards can be delayed, cut with a reset or dropped
  # in silence, changed while connections are open. The kernel here has no
  # netem, so this is where latency, resets and half-open connections come
  # from.
  #
  # Ruby threads, not a binary: the drill's traffic is a few hundred small
  # messages a second on a handful of connections, which one Ruby process
  # forwards without being the bottleneck, and it runs inside the drill, so
  # the phase changes its mode with a method call and reads its events
  # (when each client gave up on a held connection) without a control
  # protocol. Four threads a connection: a reader and a writer each way.
  #
  #   proxy = FaultProxy.new("10.231.7.2", 5672).start
  #   proxy.latency!(0.05, 0.2)   # 50–200 ms a chunk, each way, in order
  #   proxy.reset!                # a busy connection RST both ways
  #   proxy.blackhole!            # every open connection goes silent
  #   proxy.pass!
  class FaultProxy
    # One proxied connection. held_at: when it was black-holed; client_gone:
    # when the client closed (or reset) its end while held, i.e. when it
    # found out; broker_gone: the same for the broker's end.
    class Link
      attr_reader :id, :client, :upstream, :opened_at
      attr_accessor :held_at, :client_gone, :broker_gone, :reset_at, :last_down, :closed, :flushed

      def initialize(id, client, upstream)
        @id = id
        @client = client
        @upstream = upstream
        @opened_at = FaultProxy.now
        @last_down = 0.0
        @closed = false
        @flushed = 0
      end

      def held? = !@held_at.nil?
    end

    attr_reader :port, :links

    # Monotonic seconds (not Drill.now: the proxy loads without the rest of
    # the drill, as its spec does).
    def self.now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    def initialize(upstream_host, upstream_port, listen: "127.0.0.1")
      @upstream = [upstream_host, upstream_port]
      @server = TCPServer.new(listen, 0)
      @port = @server.addr[1]
      @listen = listen
      @links = []
      @lock = Mutex.new
      @delay = nil
      @ids = 0
    end

    def url(user: "guest", password: "guest") = "amqp://#{user}:#{password}@#{@listen}:#{@port}"

    def start
      @acceptor = Thread.new do
        Thread.current.report_on_exception = false
        loop { accept(@server.accept) }
      rescue IOError, SystemCallError
        nil # closed by #close
      end
      self
    end

    # Forward everything as it comes (also what was queued under latency,
    # at its due time).
    def pass! = (@delay = nil)

    # Each chunk read is held back a random min..max seconds in its
    # direction, never overtaking the chunk before it (TCP's order).
    def latency!(min, max, rng: Random.new)
      @rng = rng
      @delay = [min, max]
    end

    def live = @lock.synchronize { @links.reject(&:closed) }

    # Every connection open now stops forwarding both ways and sends
    # nothing, no FIN, no RST, whatever either end does: to each end the
    # other has vanished. New connections pass. Returns the links held.
    def blackhole!
      t = FaultProxy.now
      live.reject(&:held?).each { |l| l.held_at = t }
    end

    # A random live connection of those that carried something from the
    # broker in the last second (else any live one), or nil.
    def busy(rng: Random.new)
      open = live.reject(&:held?)
      recent = open.select { |l| FaultProxy.now - l.last_down < 1 }
      (recent.empty? ? open : recent).sample(random: rng)
    end

    # Reset link (default: a busy one): SO_LINGER 0 and close on both
    # sockets, so each end gets an RST. Returns the link.
    def reset!(link = busy)
      return nil unless link

      link.reset_at = FaultProxy.now
      link.closed = true
      [link.client, link.upstream].each { |s| abort_socket(s) }
      link
    end

    def close
      @server.close
      @acceptor&.join(2)
      live.each do |l|
        l.closed = true
        [l.client, l.upstream].each { |s| quiet_close(s) }
      end
    end

    private

    def accept(client)
      upstream = Socket.tcp(*@upstream, connect_timeout: 2)
      [client, upstream].each { |s| s.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1) }
      link = Link.new(@ids += 1, client, upstream)
      @lock.synchronize { @links << link }
      pump(link, client, upstream, :up)
      pump(link, upstream, client, :down)
    rescue SystemCallError
      quiet_close(client)
    end

    # from -> to for one direction: a reader that stamps each chunk with its
    # due time and a writer that sends it then. While the link is held,
    # chunks are read (so neither end sees its window close, as it would not
    # when the far end vanished) and dropped, and an end that closes is
    # noted, not told to the other.
    def pump(link, from, to, direction)
      queue = Queue.new
      Thread.new do
        Thread.current.report_on_exception = false
        due = 0.0
        loop do
          data = from.readpartial(65_536)
          link.last_down = FaultProxy.now if direction == :down
          next if link.held?

          due = [FaultProxy.now + delay, due].max
          queue << [due, data]
        end
      rescue IOError, SystemCallError
        gone(link, direction)
        queue << nil
      end
      Thread.new do
        Thread.current.report_on_exception = false
        while (item = queue.pop)
          due, data = item
          wait = due - FaultProxy.now
          sleep wait if wait.positive?
          to.write(data) unless link.held? || link.closed
        end
        # The sender closed: pass the FIN on, unless held or reset; once
        # both directions are done, the sockets go.
        unless link.held? || link.closed
          to.close_write
          done = @lock.synchronize { link.flushed += 1 } == 2
          if done
            link.closed = true
            [link.client, link.upstream].each { |s| quiet_close(s) }
          end
        end
      rescue IOError, SystemCallError
        nil
      end
    end

    def gone(link, direction)
      return if link.closed && !link.held?

      if link.held?
        if direction == :up
          link.client_gone ||= FaultProxy.now
        else
          link.broker_gone ||= FaultProxy.now
        end
        # Both ends gave up on it: nothing left to hold.
        finish(link) if link.client_gone && link.broker_gone
      elsif direction == :up
        link.client_gone ||= FaultProxy.now
      else
        link.broker_gone ||= FaultProxy.now
      end
    end

    def finish(link)
      link.closed = true
      [link.client, link.upstream].each { |s| abort_socket(s) }
    end

    def delay
      min, max = @delay
      return 0.0 unless min

      min + @rng.rand * (max - min)
    end

    def abort_socket(sock)
      sock.setsockopt(Socket::SOL_SOCKET, Socket::SO_LINGER, [1, 0].pack("ii"))
      sock.close
    rescue IOError, SystemCallError
      nil
    end

    def quiet_close(sock)
      sock.close
    rescue IOError, SystemCallError
      nil
    end
  end
end
