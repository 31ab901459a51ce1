# frozen_string_literal: true

require "bunny"

# AceMQ speaks plain AMQP 0-9-1 with JSON bodies: other clients publish to an
# AceMQ consumer and read what AceMQ publishes.
RSpec.describe "interop with Bunny" do
  before(:all) do
    @bunny = Bunny.new(AMQP_URL, logger: Logger.new(nil))
    @bunny.start
  end

  after(:all) { @bunny.close }

  let(:queue) { unique("interop") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
  after { mq.close }

  it "consumes a JSON message published by Bunny" do
    ch = @bunny.create_channel
    ch.default_exchange.publish(JSON.generate("order_id" => "B-7"), routing_key: queue, message_id: "bunny-1",
                                                                     type: "order.placed.v1", persistent: true)
    got = Queue.new
    sub = mq.consume(queue) { |m| got << m; AceMQ::AMQP::Ack.accept }
    m = eventually { got.pop(true) rescue nil }
    expect(m.payload).to eq("order_id" => "B-7")
    expect(m.envelope.id).to eq("bunny-1")
    expect(m.envelope.type).to eq("order.placed.v1")
    expect(m.envelope.attempt).to eq(1)
    sub.cancel
    ch.close
  end

  it "builds a payload from a foreign body as JSON.parse does: escapes, unicode, nesting, repeated keys" do
    bodies = ['{"a\"b":"c\nd","\u00e9t\u00e9":"\ud83d\ude00","raw":"été漢字","tab\t":"\/"}',
              '{"empty":{},"list":[],"deep":[[[{"x":[-0,1e2,-3.5e-3,18446744073709551615]}]]],"dup":1,"dup":2}',
              '[1,"two",null,false,{"k":"v"}]', '"just a string"', "0", "null"]
    # Past the 8 pairs a Hash is built from at once, repeated keys across
    # those groups: the last value, in the first one's place.
    many = (1..20).map { |i| %("k#{i}":#{i}) } + ['"k3":"again"', '"k12":{"k1":1,"k1":2}', '"k20":null']
    bodies << "{#{many.join(',')}}" << "[{#{many.first(9).join(',')}}]"
    ch = @bunny.create_channel
    bodies.each { |b| ch.default_exchange.publish(b, routing_key: queue, content_type: "application/json") }
    got = Queue.new
    sub = mq.consume(queue) { |m| got << m.payload; AceMQ::AMQP::Ack.accept }
    eventually { got.size == bodies.size }
    sub.cancel
    built = Array.new(bodies.size) { got.pop }
    ch.close
    expect(built).to eq(bodies.map { |b| JSON.parse(b) })
    expect(built[-2].keys).to eq((1..20).map { |i| "k#{i}" })
    expect(built[-2].values_at("k3", "k12", "k20")).to eq(["again", { "k1" => 2 }, nil])
    expect(built.first.keys).to eq(["a\"b", "été", "raw", "tab\t"])
    expect(built.first.keys).to all(be_frozen)
    expect(built.first["été"]).to eq("\u{1F600}")
    expect(built.first.values.map(&:encoding)).to all(eq(Encoding::UTF_8))
    # The encoding is set without Ruby's own call (ext/src/json.rs,
    # rstring): what Ruby works out of the text must still hold.
    expect(built.first.values).to all(be_valid_encoding)
    expect(built.first.values.map(&:ascii_only?)).to eq([true, false, false, true])
    expect(built.first.values.map(&:length)).to eq([3, 1, 5, 1])
    # Values are the handler's to change, as JSON.parse's are.
    expect(built.first.values.none?(&:frozen?)).to be(true)
  end

  it "gives a foreign message without a message id a nil id, and consumes it" do
    ch = @bunny.create_channel
    ch.default_exchange.publish(JSON.generate("n" => 1), routing_key: queue)
    got = Queue.new
    sub = mq.consume(queue) { |m| got << m; AceMQ::AMQP::Ack.accept }
    m = eventually { got.pop(true) rescue nil }
    expect(m.envelope.id).to be_nil
    expect(m.payload).to eq("n" => 1)
    sub.cancel
    ch.close
  end

  it "publishes what Bunny reads, with the envelope in properties and headers" do
    before = Time.now.to_i
    env = mq.publish({ "order_id" => "A-1" }, to: queue, type: "payment.requested.v1", headers: { "tenant" => "acme" })
    ch = @bunny.create_channel
    delivery, props, body = eventually { (r = ch.basic_get(queue, manual_ack: false)) && r[0] && r }
    expect(JSON.parse(body)).to eq("order_id" => "A-1")
    expect(props[:content_type]).to eq("application/json")
    expect(props[:message_id]).to eq(env.id)
    expect(props[:type]).to eq("payment.requested.v1")
    expect(props[:app_id]).to eq(mq.origin)
    expect(props[:delivery_mode]).to eq(2)
    expect(props[:timestamp].to_i).to be_between(before, Time.now.to_i)
    expect(props[:headers]).to include("x-acemq-id" => env.id, "x-acemq-attempt" => 1, "x-acemq-origin" => mq.origin,
                                     "tenant" => "acme")
    expect(delivery.routing_key).to eq(queue)
    ch.close
  end

  it "dead-letters a body that is not JSON byte for byte, with the reason, where Bunny can read it" do
    ch = @bunny.create_channel
    raw = "\xFFnot json at all".b
    ch.default_exchange.publish(raw, routing_key: queue, content_type: "application/json", message_id: "bad-1")
    ch.default_exchange.publish("plain words", routing_key: queue, content_type: "text/plain", message_id: "bad-2")
    handled = []
    sub = mq.consume(queue) { |m| handled << m; AceMQ::AMQP::Ack.accept }
    eventually { sub.stats[:dead_lettered] == 2 }
    sub.cancel
    copies = Array.new(2) { eventually { (r = ch.basic_get("#{queue}.dlq", manual_ack: false)) && r[0] && r } }
    by_id = copies.to_h { |_d, props, body| [props[:message_id], [props, body]] }
    props, body = by_id.fetch("bad-1")
    expect(body.b).to eq(raw)
    expect(props[:headers]["x-acemq-reason"]).to include("not JSON")
    expect(props[:headers]["x-acemq-original-routing-key"]).to eq(queue)
    props, body = by_id.fetch("bad-2")
    expect(body).to eq("plain words")
    expect(props[:headers]["x-acemq-reason"]).to include("text/plain")
    expect(handled).to be_empty
    ch.close
  end

  # The consumer reads each body once, building the payload's Ruby objects
  # as it reads (core makes every other check first): a body that is UTF-8
  # and not JSON is found so, and dead-lettered with core's reason and the
  # parser's words, between good messages that are handled in order; one by
  # one and in batches (a handler with call_many).
  [[:one_by_one, 1], [:batches, 10]].each do |(how, batch)|
    it "dead-letters each UTF-8 body that is not JSON with what the parser said, handling the good ones around it (#{how})" do
      deep = ("[" * 129) + ("]" * 129)
      bad = { "trailing" => ['{"a":1} and more', /trailing characters/],
              "cut" => ['{"order_id":', /EOF while parsing/],
              "huge" => ['{"n":1e400}', /number out of range/],
              "deep" => [deep, /recursion limit exceeded/],
              "bare" => ["hello", /expected value/] }
      ch = @bunny.create_channel
      publish = ->(body, id) { ch.default_exchange.publish(body, routing_key: queue, content_type: "application/json", message_id: id) }
      publish.call(JSON.generate("n" => 0), "good-0")
      bad.each_with_index do |(id, (body, _)), i|
        publish.call(body, id)
        publish.call(JSON.generate("n" => i + 1), "good-#{i + 1}")
      end
      # Valid JSON whose number a float cannot hold exactly: built by JSON.parse.
      publish.call('{"n":12345678901234567.5}', "long")
      handled = Queue.new
      handler = ->(m) { handled << [m.envelope.id, m.payload]; AceMQ::AMQP::Ack.accept }
      sizes = []
      if batch > 1
        handler.define_singleton_method(:call_many) { |ms| sizes << ms.size; ms.map { |m| call(m) } }
      end
      sub = mq.consume(queue, batch: batch, &handler)
      seen = Array.new(bad.size + 2) { eventually { handled.pop(true) rescue nil } }
      eventually { sub.stats[:dead_lettered] == bad.size }
      sub.cancel
      expect(seen.map(&:first)).to eq(Array.new(bad.size + 1) { |i| "good-#{i}" } + ["long"])
      expect(seen.first(bad.size + 1).map(&:last)).to eq(Array.new(bad.size + 1) { |i| { "n" => i } })
      expect(seen.last.last).to eq(JSON.parse('{"n":12345678901234567.5}'))
      expect(sizes.sum).to eq(bad.size + 2) if batch > 1
      copies = Array.new(bad.size) { eventually { (r = ch.basic_get("#{queue}.dlq", manual_ack: false)) && r[0] && r } }
      by_id = copies.to_h { |_d, props, body| [props[:message_id], [props, body]] }
      expect(by_id.keys).to match_array(bad.keys)
      bad.each do |id, (body, words)|
        props, copy = by_id.fetch(id)
        expect(copy).to eq(body)
        reason = props[:headers]["x-acemq-reason"]
        expect(reason).to start_with("body is not JSON (").and match(words)
        expect(reason).to end_with("the body is kept byte for byte on the dead-letter queue")
      end
      ch.close
    end
  end

  it "keeps a foreign publisher's header bytes and types in the dead-letter copy" do
    ch = @bunny.create_channel
    headers = { "raw" => "\xFF\xFEok".b, "n" => 7, "when" => Time.at(1_700_000_000), "nested" => { "k" => "v" } }
    ch.default_exchange.publish(JSON.generate("n" => 1), routing_key: queue, message_id: "m-bytes", headers: headers)
    sub = mq.consume(queue) { |_m| AceMQ::AMQP::Ack.reject("keep my bytes") }
    eventually { sub.stats[:dead_lettered] == 1 }
    sub.cancel
    _, props, body = eventually { ch.basic_get("#{queue}.dlq", manual_ack: false).then { |d, p, b| d && [d, p, b] } }
    expect(body).to eq(JSON.generate("n" => 1))
    expect(props[:headers]["raw"].b).to eq("\xFF\xFEok".b) # not U+FFFD twice
    expect(props[:headers]["n"]).to eq(7)
    expect(props[:headers]["when"]).to eq(Time.at(1_700_000_000)) # still an AMQP timestamp
    expect(props[:headers]["nested"]).to eq("k" => "v")
    expect(props[:headers]["x-acemq-reason"]).to eq("keep my bytes")
    ch.close
  end

  it "dead-letters a message whose headers fill a frame, dropping the largest from the copy, once" do
    ch = @bunny.create_channel
    big = { "bulk" => "x" * (127 * 1024), "tenant" => "acme" }
    ch.default_exchange.publish(JSON.generate("n" => 2), routing_key: queue, message_id: "m-big", headers: big)
    ch.default_exchange.publish(JSON.generate("n" => 3), routing_key: queue, message_id: "m-after")
    calls = Hash.new(0)
    sub = mq.consume(queue) do |m|
      calls[m.payload["n"]] += 1
      m.payload["n"] == 2 ? AceMQ::AMQP::Ack.reject("too big to keep") : AceMQ::AMQP::Ack.accept
    end
    eventually { sub.stats[:dead_lettered] == 1 && sub.stats[:accepted] == 1 }
    sub.cancel
    _, props, body = eventually { ch.basic_get("#{queue}.dlq", manual_ack: false).then { |d, p, b| d && [d, p, b] } }
    expect(body).to eq(JSON.generate("n" => 2))
    expect(props[:headers]).not_to include("bulk")
    expect(props[:headers]).to include("tenant" => "acme", "x-acemq-reason" => "too big to keep")
    expect(props[:headers]["x-acemq-dropped-headers"]).to include("bulk")
    expect(calls[2]).to eq(1) # dead-lettered once, not put back every second
    ch.close
  end
end
