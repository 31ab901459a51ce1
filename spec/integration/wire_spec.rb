# frozen_string_literal: true

require "bunny"
require "open3"
require "json"

# One wire: a Rails app and a Rust service publishing the same envelope put
# the same bytes on it, and each consumes what the other published with the
# envelope it was sent with. The Rust side is core/examples/wire.rs.
#
# Properties are compared byte for byte: the content header frame's property
# flags and property list exactly as RabbitMQ delivered them to a raw Bunny
# consumer (captured before Bunny decodes them). Bytes rather than Bunny's
# decoded Hash, because decoding loses what a foreign consumer sees: an
# Integer from Bunny may have been a 16-, 32- or 64-bit field, a String a
# long string or a byte array, and a Java or Go consumer types its fields by
# that tag. Equal bytes are equal types, equal order and equal values.
# The content header frames' property bytes, in the order Bunny decoded
# them, while capturing is on.
module WireCapture
  CAPTURED = Queue.new
  class << self
    attr_accessor :on
  end

  def decode_payload
    first = @decoded_payload.nil?
    super.tap { CAPTURED << @payload.byteslice(12..) if first && WireCapture.on }
  end
end
AMQ::Protocol::HeaderFrame.prepend(WireCapture)

RSpec.describe "the wire, from Ruby and from Rust" do
  root = File.expand_path("../..", __dir__)
  wire = File.join(root, "target/debug/examples/wire")
  define_method(:wire) { wire }

  before(:all) do
    # `cargo test -p acemq` (bin/test, rake test) builds the examples in the
    # debug profile; this makes sure the one used here is the current source.
    out, status = Open3.capture2e("cargo", "build", "--locked", "--quiet", "-p", "acemq", "--example", "wire", chdir: root)
    raise "cargo build --example wire failed:\n#{out}" unless status.success?

    @bunny = Bunny.new(AMQP_URL, logger: Logger.new(nil))
    @bunny.start
    @ch = @bunny.create_channel
    @mq = AceMQ::AMQP::Connection.open(AMQP_URL, origin: "wire-spec")
  end

  after(:all) do
    @mq&.close
    @bunny&.close
  end

  let(:queue) { unique("wire") }
  before { AceMQ::AMQP::Topology.new.queue(queue).apply(@mq) }

  # Everything an envelope carries, headers of every JSON type, and the two
  # ways of adding to it at publish time (type: and headers:, one of which
  # overrides a header of the envelope).
  let(:spec) do
    {
      "origin" => "wire-spec",
      "payload" => { "amount" => 4200, "currency" => "EUR", "order_id" => "A-1" },
      "id" => "018f2b6e-0000-7000-8000-00000000a001",
      "type" => "payment.requested.v1",
      "timestamp" => 1_700_000_000,
      "headers" => {
        "tenant" => "acme", "count" => 3, "big" => 2**40, "negative" => -7, "ratio" => 0.25, "flag" => true,
        "off" => false, "list" => [1, "two", { "three" => 3 }], "nested" => { "a" => { "b" => "c" } },
        "text" => "grüße ✓", "empty" => "", "trace" => "from-the-envelope"
      },
      "publish_type" => "payment.requested.v2",
      "publish_headers" => { "trace" => "00-4bf92f3577b34da6-00f067aa0ba902b7-01", "extra" => 1 }
    }
  end

  def publish_from_ruby(spec, to:)
    envelope = AceMQ::AMQP::Envelope.new(id: spec["id"], type: spec["type"], timestamp: spec["timestamp"],
                                         headers: spec["headers"], origin: spec["envelope_origin"],
                                         attempt: spec.fetch("attempt", 1))
    @mq.publish(spec["payload"], to: to, envelope: envelope, type: spec["publish_type"],
                                 headers: spec["publish_headers"])
  end

  def rust(*args)
    out, err, status = Open3.capture3({ "AMQP_URL" => AMQP_URL }, wire, *args)
    raise "wire #{args.first} failed: #{err}" unless status.success?

    JSON.parse(out.lines.last)
  end

  def publish_from_rust(spec, to:) = rust("publish", to, JSON.generate(spec))

  # [property bytes, Bunny's decoded properties, body] of the next message.
  def raw_get(queue)
    WireCapture.on = true
    _, props, body = eventually { (r = @ch.basic_get(queue, manual_ack: false)) && r[0] && r }
    [WireCapture::CAPTURED.pop(timeout: 5), props.to_h, body]
  ensure
    WireCapture.on = false
  end

  def envelope_hash(e)
    { "id" => e.id, "type" => e.type, "origin" => e.origin, "timestamp" => e.timestamp, "attempt" => e.attempt,
      "headers" => e.headers }
  end

  it "puts the same property and header bytes on the wire from either language" do
    publish_from_ruby(spec, to: queue)
    publish_from_rust(spec, to: queue)
    from_ruby = raw_get(queue)
    from_rust = raw_get(queue)

    expect(from_rust[1]).to eq(from_ruby[1]) # field by field first: a readable diff if they differ
    expect(from_rust[0]).to eq(from_ruby[0]) # then every byte, type tags and order included
    expect(from_rust[2]).to eq(from_ruby[2]) # the body too (its keys sorted here: see docs/rust.md)

    props = from_ruby[1]
    expect(props).to include(content_type: "application/json", delivery_mode: 2, message_id: spec["id"],
                             type: "payment.requested.v2", app_id: "wire-spec", timestamp: Time.at(1_700_000_000))
    expect(props[:headers]).to include("x-acemq-id" => spec["id"], "x-acemq-attempt" => 1,
                                       "x-acemq-origin" => "wire-spec", "tenant" => "acme", "big" => 2**40,
                                       "trace" => spec["publish_headers"]["trace"], "extra" => 1,
                                       "nested" => { "a" => { "b" => "c" } }, "text" => "grüße ✓".b) # Bunny: long strings as bytes
  end

  it "keeps an envelope's own origin and sends a publish as attempt 1, from either language" do
    odd = spec.merge("envelope_origin" => "billing@elsewhere", "attempt" => 3)
    publish_from_ruby(odd, to: queue)
    publish_from_rust(odd, to: queue)
    from_ruby = raw_get(queue)
    from_rust = raw_get(queue)

    expect(from_rust[1]).to eq(from_ruby[1])
    expect(from_rust[0]).to eq(from_ruby[0])
    expect(from_ruby[1]).to include(app_id: "billing@elsewhere")
    expect(from_ruby[1][:headers]).to include("x-acemq-origin" => "billing@elsewhere", "x-acemq-attempt" => 1)
  end

  it "lets Rust consume what Ruby published, with the same envelope" do
    sent = publish_from_ruby(spec, to: queue)
    got = rust("consume", queue)

    expect(got["payload"]).to eq(spec["payload"])
    expect(got.except("payload")).to eq(envelope_hash(sent))
    expect(got["headers"]).to eq(spec["headers"].merge(spec["publish_headers"]))
  end

  it "lets Ruby consume what Rust published, with the same envelope" do
    sent = publish_from_rust(spec, to: queue)
    got = Queue.new
    sub = @mq.consume(queue) { |m| got << m; AceMQ::AMQP::Ack.accept }
    m = eventually { got.pop(true) rescue nil } # rubocop:disable Style/RescueModifier
    sub.cancel

    expect(m.payload).to eq(spec["payload"])
    expect(envelope_hash(m.envelope)).to eq(
      "id" => sent["id"], "type" => "payment.requested.v2", "origin" => sent["origin"], "timestamp" => 1_700_000_000,
      "attempt" => 1, "headers" => spec["headers"].merge(spec["publish_headers"])
    )
    # And Rust reads its own message the same way: one decoder for both.
    publish_from_rust(spec, to: queue)
    expect(rust("consume", queue).except("payload")).to eq(envelope_hash(m.envelope))
  end
end
