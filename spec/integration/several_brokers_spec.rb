# frozen_string_literal: true

require "socket"

# Connection.open with several addresses, as for the nodes of a cluster: the
# first that answers is used, and one that is down is passed over quickly.
RSpec.describe "Connection.open with several addresses" do
  # A port on this machine that nothing listens on.
  def dead_url
    server = TCPServer.new("127.0.0.1", 0)
    port = server.addr[1]
    server.close
    "amqp://guest:guest@127.0.0.1:#{port}"
  end

  let(:queue) { unique("several") }

  it "passes over an address that is down and uses the next" do
    mq = AceMQ::AMQP::Connection.open([dead_url, AMQP_URL], connect_timeout: 2)
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    got = Queue.new
    sub = mq.consume(queue) { |m| got << m.payload; AceMQ::AMQP::Ack.accept }
    mq.publish({ "n" => 1 }, to: queue)
    expect(eventually { got.pop(true) rescue nil }).to eq("n" => 1)
    sub.cancel
    mq.close
  end

  it "says what each address answered when none does, without a password" do
    urls = [dead_url.sub("guest:guest", "guest:s3cret"), dead_url]
    expect { AceMQ::AMQP::Connection.open(urls, connect_timeout: 1) }
      .to raise_error(AceMQ::AMQP::ConnectionFailed, /could not connect to any of 2 addresses: .*127\.0\.0\.1.*; .*127\.0\.0\.1/) { |e|
        expect(e.message).not_to include("s3cret")
      }
  end

  it "refuses memory:// among several, and an empty list" do
    expect { AceMQ::AMQP::Connection.open(["memory://x", AMQP_URL]) }
      .to raise_error(AceMQ::AMQP::InvalidURL, /memory:\/\/ cannot be one of several/)
    expect { AceMQ::AMQP::Connection.open([]) }.to raise_error(AceMQ::AMQP::ConfigurationError, /URL string or an Array/)
  end
end

require_relative "../../drill/support"
require_relative "../../drill/node"

RSpec.describe "Connection.open with several addresses, when the one in use goes away" do
  before(:all) do
    @node = Drill::Node.new
    @node.start
  end

  after(:all) { @node&.destroy }

  it "dials the next address, and a subscription resumes there" do
    queue = unique("failover")
    mq = AceMQ::AMQP::Connection.open([@node.url, AMQP_URL], connect_timeout: 2)
    # Two separate brokers here, not a cluster: the queue is declared on each.
    [@node.url, AMQP_URL].each do |u|
      c = AceMQ::AMQP::Connection.open(u)
      AceMQ::AMQP::Topology.new.queue(queue).apply(c)
      c.close
    end
    got = Queue.new
    sub = mq.consume(queue) { |m| got << m.payload["n"]; AceMQ::AMQP::Ack.accept }
    mq.publish({ "n" => 1 }, to: queue)
    expect(eventually { got.pop(true) rescue nil }).to eq(1)

    @node.stop_app # the address in use goes away
    eventually(timeout: 15) do
      mq.publish({ "n" => 2 }, to: queue)
    rescue AceMQ::AMQP::ConnectionError, AceMQ::AMQP::TimeoutError
      nil
    end
    expect(eventually(timeout: 15) { got.pop(true) rescue nil }).to eq(2) # on the shared broker now
    sub.cancel
    mq.close
  ensure
    @node.start_app
  end
end
