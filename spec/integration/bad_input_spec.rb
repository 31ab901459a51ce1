# frozen_string_literal: true

require "sqlite3"
require "tmpdir"
require "acemq/amqp/patterns"

# Misuse gets an AceMQ error that says what to do, and the process goes on.
RSpec.describe "bad input from the code that uses AceMQ" do
  let(:queue) { unique("bad") }

  shared_examples "arguments refused" do
    it "refuses what cannot be a message, with its own error classes" do
      mq = AceMQ::AMQP::Connection.open(url)
      AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
      deep = []
      200.times.reduce(deep) { |level, _| [].tap { |inner| level << inner } }
      expect { mq.publish(Object.new, to: queue) }.to raise_error(AceMQ::AMQP::EncodingError, /no JSON form/)
      expect { mq.publish(deep, to: queue) }.to raise_error(AceMQ::AMQP::EncodingError, /nesting of 100 is too deep/)
      expect { mq.publish({}, to: queue, headers: 3) }.to raise_error(AceMQ::AMQP::ConfigurationError, /headers: must be a Hash/)
      expect { AceMQ::AMQP::Envelope.new(id: "") }.to raise_error(AceMQ::AMQP::ConfigurationError, /id: must not be empty/)
      expect { AceMQ::AMQP::Envelope.new(timestamp: "soon") }.to raise_error(AceMQ::AMQP::ConfigurationError, /timestamp:/)
      expect { AceMQ::AMQP::Envelope.new(timestamp: -1) }.to raise_error(AceMQ::AMQP::ConfigurationError, /outside/)
      expect { mq.publish({ "text" => "#<not an object>" }, to: queue) }.not_to raise_error # a string is a string
      mq.close
    end

    # Issue 47's hostile run: names that are not UTF-8 raised Ruby's own
    # ::EncodingError, and headers JSON::GeneratorError or nothing at all
    # (an Object sent as its to_s, 2**70 as a Float). A good publish on
    # either side of each goes through, and nothing else is stored.
    it "refuses names that are not UTF-8 and headers that cannot be sent, between good publishes" do
      mq = AceMQ::AMQP::Connection.open(url)
      AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
      invalid = ->(s) { s.dup.force_encoding(Encoding::UTF_8) }
      deep = {}
      120.times { deep = { "a" => deep } }
      refused = {
        -> { mq.publish({}, to: invalid.call("q\xFF")) } => [AceMQ::AMQP::ConfigurationError, "to: must be UTF-8"],
        -> { mq.publish({}, to: queue, exchange: invalid.call("x\xFF")) } => [AceMQ::AMQP::ConfigurationError, "exchange: must be UTF-8"],
        -> { mq.publish({}, to: queue, type: invalid.call("t\xFF")) } => [AceMQ::AMQP::ConfigurationError, "type: must be UTF-8"],
        -> { mq.consume(invalid.call("q\xFF")) { AceMQ::AMQP::Ack.accept } } => [AceMQ::AMQP::ConfigurationError, "queue: must be UTF-8"],
        -> { AceMQ::AMQP::Topology.new.queue(invalid.call("q\xFF")).apply(mq) } => [AceMQ::AMQP::ConfigurationError, "queue: must be UTF-8"],
        -> { AceMQ::AMQP::Topology.new.exchange(invalid.call("x\xFF")) } => [AceMQ::AMQP::ConfigurationError, "exchange: must be UTF-8"],
        -> { mq.publish({}, to: queue, envelope: AceMQ::AMQP::Envelope.new(id: "\xFF".b)) } => [AceMQ::AMQP::ConfigurationError, "id: must be UTF-8"],
        -> { mq.publish({}, to: queue, envelope: AceMQ::AMQP::Envelope.new(origin: invalid.call("o\xFF"))) } => [AceMQ::AMQP::ConfigurationError, "origin: must be UTF-8"],
        -> { mq.queue_counts(invalid.call("q\xFF")) } => [AceMQ::AMQP::ConfigurationError, "queue: must be UTF-8"],
        -> { mq.replay_dead_letters(invalid.call("q\xFF")) } => [AceMQ::AMQP::ConfigurationError, "queue: must be UTF-8"],
        -> { mq.publish({}, to: queue, headers: { "h" => invalid.call("v\xFF") }) } => [AceMQ::AMQP::EncodingError, "UTF-8 Strings"],
        -> { mq.publish({}, to: queue, headers: { "h" => Float::NAN }) } => [AceMQ::AMQP::EncodingError, "NaN"],
        -> { mq.publish({}, to: queue, headers: { "h" => Object.new }) } => [AceMQ::AMQP::EncodingError, "convert it first"],
        -> { mq.publish({}, to: queue, headers: { "h" => [1, 2**70] }) } => [AceMQ::AMQP::EncodingError, "64-bit"],
        -> { mq.publish({}, to: queue, headers: deep) } => [AceMQ::AMQP::EncodingError, "too deep"]
      }
      refused.each do |call, (klass, words)|
        mq.publish({ "good" => 1 }, to: queue)
        expect { call.call }.to raise_error(klass, /#{Regexp.escape(words)}/)
        mq.publish({ "good" => 2 }, to: queue)
      end
      # Converted, not refused: Latin-1 text, and binary bytes that are UTF-8.
      mq.publish({ "good" => 3 }, to: queue.encode(Encoding::ISO_8859_1))
      mq.publish({ "good" => 4 }, to: queue.b)
      expect(eventually { mq.queue_counts(queue)&.fetch(:ready) == refused.size * 2 + 2 }).to be(true)
    ensure
      mq&.close
    end
  end

  context "on memory://" do
    let(:url) { memory_url }

    include_examples "arguments refused"
  end

  context "on RabbitMQ" do
    let(:url) { AMQP_URL }

    include_examples "arguments refused"
  end

  # In processes of their own, with and without ActiveSupport (which other
  # specs load): inside JSON.generate ActiveSupport's to_json defers to the
  # json gem's, which writes an object as its to_s, so both must refuse it.
  it "refuses an object with no JSON form of its own, with or without ActiveSupport loaded" do
    script = <<~RUBY
      require "acemq/amqp"
      require "active_support/json" if ARGV[0] == "as"
      mq = AceMQ::AMQP::Connection.open("memory://formless")
      AceMQ::AMQP::Topology.new.queue("q").apply(mq)
      thing = Object.new
      thing.instance_variable_set(:@n, 1)
      begin
        mq.publish({ "at" => [thing] }, to: "q")
        sub = mq.consume("q") { |m| puts JSON.generate(m.payload); exit!(0) }
        sleep 5
      rescue AceMQ::AMQP::EncodingError => e
        puts e.message
      end
    RUBY
    lib = File.expand_path("../../lib", __dir__)
    plain = IO.popen([RbConfig.ruby, "-I", lib, "-e", script], err: %i[child out], &:read)
    expect(plain).to include("the payload holds a Object, which has no JSON form", "convert it first")
    with_as = IO.popen([RbConfig.ruby, "-I", lib, "-e", script, "as"], err: %i[child out], &:read)
    expect(with_as).to include("the payload holds a Object, which has no JSON form")
  end

  it "never puts a password in an error message" do
    expect { AceMQ::AMQP::Connection.open("amqp://guest:s3cr@t@nowhere:99999") }
      .to raise_error(AceMQ::AMQP::InvalidURL) { |e| expect(e.message).not_to include("s3cr") }
    expect { AceMQ::AMQP::Connection.open("amqp://guest:s3cr@t@127.0.0.1:1", connect_timeout: 1) }
      .to raise_error(AceMQ::AMQP::ConnectionError) { |e| expect(e.message).not_to include("s3cr", "t@127") }
    expect { AceMQ::AMQP::Connection.open("http://guest:hunter2@localhost") }
      .to raise_error(AceMQ::AMQP::InvalidURL) { |e| expect(e.message).not_to include("hunter2") }
  end

  it "fails a connection inherited by a forked child at once, saying to open one after forking" do
    mq = AceMQ::AMQP::Connection.open(AMQP_URL)
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      begin
        mq.publish({ "from" => "child" }, to: queue)
        writer.write("published")
      rescue AceMQ::AMQP::ConnectionClosed => e
        writer.write(format("%.2f %s", Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0, e.message))
      end
      # The child's fresh connection works.
      fresh = AceMQ::AMQP::Connection.open(AMQP_URL)
      fresh.publish({ "from" => "child" }, to: queue)
      fresh.close
      writer.close
      exit!(0)
    end
    writer.close
    Process.wait(pid)
    seconds, message = reader.read.split(" ", 2)
    expect($?.exitstatus).to eq(0)
    expect(Float(seconds)).to be < 1
    expect(message).to include("(a fork): open a new connection in the child")
    mq.publish({ "from" => "parent" }, to: queue) # the parent's connection is untouched
    mq.close
  end

  it "fails an outbox row that can never be sent on its own, and sends the rows around it" do
    Dir.mktmpdir do |dir|
      path = File.join(dir, "outbox.db")
      mq = AceMQ::AMQP::Connection.open(AMQP_URL)
      AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
      store = AceMQ::AMQP::Patterns::SQLOutboxStore.new(path: path)
      store.create_schema
      db = SQLite3::Database.new(path)
      add = ->(to) { store.add(AceMQ::AMQP::Patterns.record(mq, { "to" => to.size }, to: to), connection: db) }
      # add refuses it in the caller's transaction...
      expect { add.call("k" * 300) }.to raise_error(AceMQ::AMQP::ConfigurationError, /routing key is 300 bytes/)
      # ...and a row written some other way (an older version, by hand) fails alone.
      add.call(queue)
      add.call(queue)
      db.execute("UPDATE #{store.table} SET routing_key = ? WHERE id = (SELECT MIN(id) FROM #{store.table})", ["k" * 300])
      add.call(queue)
      errors = []
      relay = AceMQ::AMQP::Patterns::OutboxRelay.new(mq, store, on_error: ->(e, exchange:, routing_key:) { errors << e })
      expect(relay.sweep).to eq(2)
      expect(store.backlog).to have_attributes(count: 1, stuck: 1)
      expect(store.stuck(1).first.last_error).to include("routing key is 300 bytes")
      expect(errors.map(&:class)).to eq([AceMQ::AMQP::ConfigurationError])
      db.close
      mq.close
    end
  end
end
