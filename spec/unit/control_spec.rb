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

  it "raises Unreachable when the endpoint accepts and never answers" do
    server = TCPServer.new("127.0.0.1", 0)
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    expect { described_class.new("http://127.0.0.1:#{server.addr[1]}", timeout: 1, read_timeout: 0.3).call(:get, "/live") }
      .to raise_error(described_class::Unreachable)
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0).to be < 5
  ensure
    server&.close
  end
end
