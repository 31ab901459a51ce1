# frozen_string_literal: true

require "socket"
require "acemq/control"

# The one client of a runner's endpoint (acemq ctl, the dashboard, the
# --processes parent): what it sends, what it answers, and its errors.
RSpec.describe AceMQ::Control do
  # A one-request-at-a-time HTTP server that records each request and
  # answers with the code and body given.
  def serve(code, body)
    server = TCPServer.new("127.0.0.1", 0)
    seen = Queue.new
    thread = Thread.new do
      loop do
        client = server.accept
        head = +""
        head << client.readpartial(4096) until head.include?("\r\n\r\n")
        seen << head
        client.write("HTTP/1.1 #{code} X\r\nContent-Length: #{body.bytesize}\r\nConnection: close\r\n\r\n#{body}")
        client.close
      end
    rescue IOError
      nil
    end
    [server, seen, thread]
  end

  # The block raises Unreachable, and within limit seconds.
  def unreachable_within(limit, &block)
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    expect(&block).to raise_error(described_class::Unreachable)
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0).to be < limit
  end

  it "sends the control token as a bearer and answers [code, body] whatever the code" do
    server, seen, = serve(403, "forbidden: send the token\n")
    control = described_class.new("http://127.0.0.1:#{server.addr[1]}/", token: "s3cret", timeout: 2)
    expect(control.call(:post, "/consumers/A%2FB/pause")).to eq([403, "forbidden: send the token\n"])
    head = seen.pop
    expect(head).to start_with("POST /consumers/A%2FB/pause HTTP/1.1")
    expect(head).to match(/^Authorization: Bearer s3cret\r$/i)
    expect { control.pause("A/B") }.to raise_error(described_class::Refused, "forbidden: send the token") { |e| expect(e.code).to eq(403) }
  ensure
    server&.close
  end

  it "sends no Authorization without a token" do
    server, seen, = serve(200, "paused X\n")
    expect(described_class.new("http://127.0.0.1:#{server.addr[1]}", token: nil).pause("X")).to eq("paused X")
    expect(seen.pop).not_to match(/authorization/i)
    expect(described_class.new("http://127.0.0.1:#{server.addr[1]}", token: "").resume("X")).to eq("paused X")
    expect(seen.pop).not_to match(/authorization/i)
  ensure
    server&.close
  end

  it "raises Unreachable naming the URL when nothing listens, and InvalidURL for what is not an http:// URL" do
    port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    expect { described_class.new("http://127.0.0.1:#{port}", timeout: 1).status }
      .to raise_error(described_class::Unreachable, %r{\Ahttp://127\.0\.0\.1:#{port}/status: })
    ["ftp://127.0.0.1:9394", "127.0.0.1:9394", "http://", "http://exa mple", nil, 9394].each do |url|
      expect { described_class.new(url) }.to raise_error(described_class::InvalidURL, /http:\/\/127\.0\.0\.1:9394/)
    end
  end

  # The break-it run's findings, each as it was found.
  describe "what a hostile or careless caller gives it" do
    it "speaks TLS to an https:// URL: the token never goes in clear to a URL that said https" do
      server, seen, = serve(200, "paused X\n")
      control = described_class.new("https://127.0.0.1:#{server.addr[1]}", token: "SECRET", timeout: 2)
      expect { control.pause("X") }.to raise_error(described_class::Unreachable)
      expect(seen.empty? || !seen.pop.include?("SECRET")).to be(true)
    ensure
      server&.close
    end

    it "refuses a port out of range, a user and password, and a query, saying which, and never shows the password" do
      { "http://127.0.0.1:99999" => /port 99999 is not 1 to 65535/, "http://ops:hunter2@127.0.0.1:9394" => /user and password/,
        "http://127.0.0.1:9394?x=1" => /query or fragment/ }.each do |url, why|
        expect { described_class.new(url) }.to raise_error(described_class::InvalidURL, why) { |e| expect(e.message).not_to include("hunter2") }
      end
    end

    it "reaches an IPv6 literal" do
      server = begin
        TCPServer.new("::1", 0)
      rescue SystemCallError
        skip "no IPv6 loopback here"
      end
      Thread.new do
        c = server.accept
        c.readpartial(4096)
        c.write("HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\npaused X\n")
        c.close
      end
      expect(described_class.new("http://[::1]:#{server.addr[1]}", timeout: 2).pause("X")).to eq("paused X")
    ensure
      server&.close
    end

    it "reads a token as a secret file holds it (a line break at the end), and refuses one with a line break inside" do
      server, seen, = serve(200, "paused X\n")
      described_class.new("http://127.0.0.1:#{server.addr[1]}", token: "s3cret\n").pause("X")
      expect(seen.pop).to match(/^Authorization: Bearer s3cret\r$/i)
      expect { described_class.new("http://127.0.0.1:1", token: "tok\r\nX-Evil: 1") }
        .to raise_error(described_class::InvalidRequest, /line break/)
    ensure
      server&.close
    end

    it "sends a name as one path segment, and refuses an empty one" do
      server, seen, = serve(404, "")
      control = described_class.new("http://127.0.0.1:#{server.addr[1]}", timeout: 2)
      expect { control.pause("..") }.to raise_error(described_class::Refused) do |e|
        # An empty 404 (another service on the port) names the URL and the code.
        expect(e.message).to match(%r{http://127\.0\.0\.1:\d+/consumers/%2E%2E/pause answered 404 with no message})
      end
      expect(seen.pop).to start_with("POST /consumers/%2E%2E/pause ")
      expect { control.pause("a b") }.to raise_error(described_class::Refused)
      expect(seen.pop).to start_with("POST /consumers/a%20b/pause ")
      ["", " ", nil].each { |bad| expect { control.pause(bad) }.to raise_error(described_class::InvalidRequest, /class name/) }
    ensure
      server&.close
    end

    it "keeps a Refused message short, and says a /status that is not JSON is not a runner's" do
      server, = serve(500, "x" * 100_000)
      expect { described_class.new("http://127.0.0.1:#{server.addr[1]}").pause("X") }
        .to raise_error(described_class::Refused) { |e| expect(e.message.length).to be <= described_class::MESSAGE_LIMIT + 1 }
      server.close
      server, = serve(200, "<html>hello</html>")
      expect { described_class.new("http://127.0.0.1:#{server.addr[1]}").status }
        .to raise_error(described_class::Refused, /not a runner's JSON status/)
    ensure
      server&.close
    end

    it "gives up within timeout + read_timeout in all on a server that drips its answer or says 100 Continue for ever" do
      server = TCPServer.new("127.0.0.1", 0)
      Thread.new do
        c = server.accept
        c.readpartial(4096)
        loop do
          c.write("HTTP/1.1 100 Continue\r\n\r\n")
          sleep 0.1
        end
      rescue IOError, SystemCallError
        nil
      end
      unreachable_within(4) { described_class.new("http://127.0.0.1:#{server.addr[1]}", timeout: 1, read_timeout: 1).pause("X") }
    ensure
      server&.close
    end
  end

  it "raises Unreachable when the endpoint accepts and never answers" do
    server = TCPServer.new("127.0.0.1", 0)
    unreachable_within(5) { described_class.new("http://127.0.0.1:#{server.addr[1]}", timeout: 1, read_timeout: 0.3).call(:get, "/live") }
  ensure
    server&.close
  end
end
