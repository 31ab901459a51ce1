# frozen_string_literal: true

require "json"

# A publish's body is written by the engine for the values JSON.generate's C
# generator writes itself, and by JSON.generate for everything else: either
# way the bytes are JSON.generate's. AMQP._generate answers nil where it
# leaves the payload to JSON.generate.
RSpec.describe "a payload's JSON (AMQP._generate)" do
  def generate(payload) = AceMQ::AMQP.__send__(:_generate, payload)

  # Text with everything the generator treats specially in it.
  ALPHABET = ["a", "Z", "0", " ", "\"", "\\", "/", "\n", "\r", "\t", "\f", "\b", "\u0000", "\u0001", "\u001f",
              "\u007f", "é", "漢", "\u2028", "\u{1F600}", "#<"].freeze

  def text(rng) = Array.new(rng.rand(0..40)) { ALPHABET[rng.rand(ALPHABET.size)] }.join

  def value(rng, depth)
    case depth > 3 ? rng.rand(6) : rng.rand(9)
    when 0 then nil
    when 1 then rng.rand(2).zero?
    when 2 then [rng.rand(-2**40..2**40), 2**62 - 1, -2**62, 0, -7][rng.rand(5)]
    when 3 then [rng.rand * 10**rng.rand(-8..25), -rng.rand, 0.0, -0.0, 100.0, 1e100, 2.5e-5][rng.rand(7)]
    when 4 then rng.rand(2**64..2**80) * (rng.rand(2).zero? ? 1 : -1)
    when 5 then text(rng)
    when 6 then Array.new(rng.rand(0..4)) { value(rng, depth + 1) }
    else Array.new(rng.rand(0..4)) { [rng.rand(2).zero? ? text(rng) : text(rng).to_sym, value(rng, depth + 1)] }.to_h
    end
  end

  it "writes what JSON.generate writes, byte for byte, for a thousand random payloads" do
    rng = Random.new(RSpec.configuration.seed)
    1000.times do
      payload = value(rng, 0)
      ours = generate(payload)
      expect(ours).not_to be_nil, "left #{payload.inspect} to JSON.generate"
      expect(ours.b).to eq(JSON.generate(payload).b), "for #{payload.inspect}"
      expect(ours.encoding).to eq(Encoding::UTF_8)
    end
  end

  it "writes the bench's 1 KiB order as JSON.generate does" do
    order = { "order_id" => "A-00000001", "customer" => { "id" => 4217, "name" => "Ada Lovelace" },
              "items" => [{ "sku" => "BK-001", "qty" => 2, "price" => 12.5 }], "note" => "x" * 900, currency: "EUR" }
    expect(generate(order)).to eq(JSON.generate(order))
  end

  it "leaves to JSON.generate what only it writes: its to_json hooks, its conversions and its errors" do
    subclass = Class.new(Hash)
    string_subclass = Class.new(String)
    singleton = +"s"
    singleton.define_singleton_method(:to_json) { |*| '"other"' }
    deep = [].tap { |a| 100.times.reduce(a) { |x, _| [].tap { |y| x << y } } }
    [Time.at(0), :symbol, Object.new, subclass[{ "a" => 1 }], string_subclass.new("x"), singleton, Float::NAN,
     Float::INFINITY, "\xff", "é".encode("ISO-8859-1"), "abc".b, { 1 => 2 }, { nil => 1 }, [1, { "t" => Time.now }],
     deep].each do |payload|
      expect(generate(payload)).to be_nil, "wrote #{payload.inspect} itself"
    end
    # As deep as JSON.generate goes (100 levels) is still written here.
    ok = [].tap { |a| 99.times.reduce(a) { |x, _| [].tap { |y| x << y } } }
    expect(generate(ok)).to eq(JSON.generate(ok))
  end

  it "publishes through JSON.generate whatever it leaves, with JSON.generate's hooks and errors" do
    mq = AceMQ::AMQP::Connection.open(memory_url)
    queue = unique("generate")
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    at = Time.at(0).utc
    mq.publish({ "at" => at, "n" => 1 }, to: queue)
    expect { mq.publish({ "bad" => Float::NAN }, to: queue) }.to raise_error(AceMQ::AMQP::EncodingError, /NaN/)
    expect { mq.publish({ "o" => Object.new }, to: queue) }.to raise_error(AceMQ::AMQP::EncodingError, /no JSON form/)
    got = Queue.new
    sub = mq.consume(queue) { |m| got << m.payload; AceMQ::AMQP::Ack.accept }
    expect(got.pop).to eq(JSON.parse(JSON.generate("at" => at, "n" => 1)))
    sub.cancel
  end
end
