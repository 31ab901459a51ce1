# frozen_string_literal: true

require "open3"
require "zlib"

# A client that is not Ruby: Python's pika (bin/setup installs it into
# tmp/interop/venv; ACEMQ_PYTHON names another Python that has it). pika
# publishes transient by default and sets no timestamp, as amqplib and
# amqp-publish do. What pika itself gets wrong is not AceMQ's: it reads float
# headers as integers (none here).
RSpec.describe "interop with pika (Python)" do
  PIKA_CLIENT = File.expand_path("../support/interop/pika_client.py", __dir__)
  VENV_PYTHON = File.expand_path("../../tmp/interop/venv/bin/python", __dir__)

  # A Python that runs, or nil: where there is none (the Debian unstable
  # chroot has no Python) the examples are skipped. One that runs without
  # pika fails them: that is a setup that did not happen, not a machine
  # that cannot run them.
  def self.python
    [ENV.fetch("ACEMQ_PYTHON", nil), VENV_PYTHON, "python3"].compact.find do |py|
      system(py, "-c", "import sys", out: File::NULL, err: File::NULL)
    end
  end

  before(:all) do
    @python = self.class.python
    skip "no Python runs here to drive pika (bin/setup puts pika in tmp/interop/venv where python3 exists)" unless @python
    _, err, st = Open3.capture3(@python, "-c", "import pika")
    raise "#{@python} has no pika (#{err.strip}): run bin/setup" unless st.success?
  end

  let(:queue) { unique("pika") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:json_hex) { ->(h) { JSON.generate(h).unpack1("H*") } }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
  after { mq.close }

  def pika(*args, input: "")
    out, err, st = Open3.capture3("timeout", "30", @python, PIKA_CLIENT, args[0], AMQP_URL, *args.drop(1), stdin_data: input)
    raise "pika #{args.first} failed (#{st.exitstatus}): #{err}" unless st.success?

    out
  end

  def gzip(text)
    io = StringIO.new("".b)
    gz = Zlib::GzipWriter.new(io)
    gz.write(text)
    gz.close
    io.string
  end

  # Every property pika can set, the way pika sends it: transient (no
  # delivery_mode), no timestamp, a per-message TTL, and a header of bytes
  # that are not UTF-8.
  let(:properties) do
    { "content_type" => "application/json", "priority" => 3, "correlation_id" => "corr-1",
      "reply_to" => "replies", "expiration" => "60000", "type" => "order.placed.v1", "user_id" => "guest",
      "app_id" => "py-shop", "cluster_id" => "eu-1" }
  end
  let(:signature) { "\xFF\x00\xFEsig".b }
  let(:headers) { { "sig" => { "bytes_hex" => signature.unpack1("H*") }, "tenant" => "acme", "n" => 7 } }

  it "reads a bad message between two good ones, keeps every property on the retry and DLQ copies, persistent" do
    good = lambda do |id, encoding, body|
      { "body_hex" => body.unpack1("H*"), "headers" => headers,
        "properties" => properties.merge("message_id" => id, "content_encoding" => encoding) }
    end
    bad_body = gzip("this is not JSON")
    messages = [
      good.call("good-1", "gzip", gzip(JSON.generate("order" => "A-1"))),
      good.call("bad", "gzip", bad_body),
      good.call("good-2", "deflate", Zlib::Deflate.deflate(JSON.generate("order" => "A-2")))
    ]
    pika("publish", queue, input: JSON.generate(messages))

    seen = Queue.new
    sub = mq.consume(queue, retries: { max_attempts: 2, initial_delay: 0.2, max_delay: 0.2 }) do |m|
      seen << [m.id, m.attempt, m.payload, m.headers, m.envelope.timestamp, m.delivery.properties]
      # good-2 fails once: its second delivery is the retry copy.
      m.id == "good-2" && m.attempt == 1 ? AceMQ::AMQP::Ack.retry("once more") : AceMQ::AMQP::Ack.accept
    end
    eventually(timeout: 10) { seen.size == 3 && sub.stats[:dead_lettered] == 1 }
    sub.cancel
    runs = Array.new(3) { seen.pop }
    expect(runs.map { |r| r[0, 2] }).to eq([["good-1", 1], ["good-2", 1], ["good-2", 2]])

    # Read: decompressed, every property by name, no timestamp as nil, the
    # byte-array header as binary.
    _, _, payload, hdrs, timestamp, props = runs[0]
    expect(payload).to eq("order" => "A-1")
    expect(timestamp).to be_nil
    expect(props.to_h.except(:headers)).to eq(
      content_type: "application/json", content_encoding: "gzip", delivery_mode: nil, priority: 3,
      correlation_id: "corr-1", reply_to: "replies", expiration: "60000", message_id: "good-1", timestamp: nil,
      type: "order.placed.v1", user_id: "guest", app_id: "py-shop", cluster_id: "eu-1"
    )
    expect(props).not_to be_persistent
    expect(hdrs["sig"]).to eq(signature)
    expect(hdrs["sig"].encoding).to eq(Encoding::BINARY)
    expect(props.headers["sig"]).to eq(signature)
    expect(hdrs).to include("tenant" => "acme", "n" => 7)
    expect(runs[1][2]).to eq("order" => "A-2") # deflate

    # The retry copy: the same properties, persistent, its TTL in a header.
    retried = runs[2][5]
    expect(runs[2][2]).to eq("order" => "A-2")
    expect(retried.to_h.except(:headers, :delivery_mode, :expiration))
      .to eq(runs[1][5].to_h.except(:headers, :delivery_mode, :expiration))
    expect([retried.delivery_mode, retried.expiration]).to eq([2, nil])
    expect(retried.headers).to include("x-acemq-original-expiration" => "60000", "sig" => signature)
    expect(runs[2][3]["sig"]).to eq(signature)

    # The dead letter, read by pika: the compressed body byte for byte, every
    # property, persistent, the header bytes as sent.
    dead = JSON.parse(pika("get", "#{queue}.dlq", "1")).first
    expect([dead["body_hex"]].pack("H*")).to eq(bad_body)
    expect(dead["properties"]).to eq(
      properties.merge("message_id" => "bad", "content_encoding" => "gzip", "delivery_mode" => 2,
                       "expiration" => nil, "timestamp" => nil)
    )
    expect(dead["headers"]).to include("sig" => { "bytes_hex" => signature.unpack1("H*") }, "tenant" => "acme",
                                       "n" => 7, "x-acemq-original-expiration" => "60000")
    expect(dead["headers"]["x-acemq-reason"]).to include("not JSON")
  end
end
