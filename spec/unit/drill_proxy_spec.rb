# frozen_string_literal: true

require_relative "../../drill/proxy"

# The network drill's fault-injecting proxy (drill/proxy.rb), against a TCP
# server of the spec's own: what each mode does to the bytes and to the
# ends of a connection. No broker.
RSpec.describe "Drill::FaultProxy" do
  let(:server) { TCPServer.new("127.0.0.1", 0) }
  let(:proxy) { Drill::FaultProxy.new("127.0.0.1", server.addr[1]).start }
  let(:client) { TCPSocket.new("127.0.0.1", proxy.port) }
  let(:far) { server.accept }

  after do
    [client, far].each { |s| s.close unless s.closed? }
    proxy.close
    server.close
  end

  def read_exactly(sock, n)
    buf = +""
    buf << sock.readpartial(n - buf.bytesize) while buf.bytesize < n
    buf
  end

  it "forwards both ways, and a close as an end of file" do
    client.write("ping")
    expect(read_exactly(far, 4)).to eq("ping")
    far.write("pong")
    expect(read_exactly(client, 4)).to eq("pong")
    client.close
    expect(far.read).to eq("")
  end

  it "keeps the order of what it delays by a different amount each time" do
    proxy.latency!(0.0, 0.05, rng: Random.new(7))
    client # connected before the server accepts
    sent = Array.new(40) { |i| format("%03d;", i) }
    writer = Thread.new do
      sent.each do |chunk|
        client.write(chunk)
        sleep 0.002 # separate reads, so separate delays
      end
    end
    got = read_exactly(far, sent.join.bytesize)
    writer.join
    expect(got).to eq(sent.join)
  end

  it "black-holes an open connection: nothing forwarded, no FIN, and the client's giving up noted" do
    client.write("a")
    expect(read_exactly(far, 1)).to eq("a")
    held = proxy.blackhole!
    expect(held.size).to eq(1)
    client.write("lost")
    far.write("also lost")
    client.close
    eventually { held.first.client_gone }
    # The client's bytes and its FIN stopped at the proxy.
    expect(far.read_nonblock(16, exception: false)).to eq(:wait_readable)
    # A connection made after the black-holing passes.
    other = TCPSocket.new("127.0.0.1", proxy.port)
    peer = server.accept
    other.write("new")
    expect(read_exactly(peer, 3)).to eq("new")
    other.close
    peer.close
  end

  it "resets a connection: each end gets an RST" do
    client.write("x")
    expect(read_exactly(far, 1)).to eq("x")
    expect(proxy.reset!).not_to be_nil
    expect { client.readpartial(1) }.to raise_error(Errno::ECONNRESET)
    expect { far.readpartial(1) }.to raise_error(Errno::ECONNRESET)
  end
end
