# frozen_string_literal: true

require "open3"
require "rbconfig"
require "acemq/rails"
require "acemq/rspec/helpers"
require "acemq/rspec/matchers"

# The test kit (acemq/rspec) on memory://, in this suite's own process. It
# is installed for the groups tagged acemq_kit only: `require "acemq/rspec"`
# would give every example of the suite the kit's publisher, which the
# other specs here do not expect. spec/kit runs it as an application does,
# under rspec-rails (spec/integration/rspec_kit_rails_spec.rb).
RSpec.configure { |config| AceMQ::RSpec::Harness.install_into(config, acemq_kit: true) }

RSpec.describe AceMQ::RSpec, acemq_kit: true do
  # A consumer class named by stub_const: named, as the runner needs, and
  # gone after the example. Named after Class.new has run the body, so it
  # never enters AceMQ::Rails::Consumer's registry, which other specs read.
  def consumer_class(name = "KitConsumer#{SecureRandom.hex(4)}", &body)
    stub_const(name, Class.new(AceMQ::Rails::Consumer, &body))
  end

  # What an example expects to fail, with its message.
  def failure_of
    yield
    raise "expected a failure"
  rescue RSpec::Expectations::ExpectationNotMetError => e
    e.message
  end

  let(:accepting) do
    consumer_class do
      queue "kit.accepting"
      def call(message)
        (@seen ||= []) << [message, Thread.current]
        accept
      end
      attr_reader :seen
    end
  end

  let(:flaky) do
    consumer_class do
      queue "kit.flaky"
      retries max_attempts: 3, initial_delay: 60, max_delay: 600
      def call(_message) = retry_later("gateway down")
    end
  end

  describe "#acemq_message" do
    it "builds a message as a delivery hands it over: the payload through JSON, the envelope, the delivery" do
      message = acemq_message({ order_id: "A-1", at: Time.at(0).utc }, id: "m-1", type: "payment.due.v1",
                                                                       attempt: 2, headers: { trace: "t-1" },
                                                                       queue: "shop.payments")

      expect(message.payload).to eq("order_id" => "A-1", "at" => "1970-01-01 00:00:00 UTC")
      expect([message.id, message.type, message.attempt, message.headers])
        .to eq(["m-1", "payment.due.v1", 2, { "trace" => "t-1" }])
      expect(message.delivery.to_h).to eq(queue: "shop.payments", exchange: "", routing_key: "shop.payments",
                                          redelivered: false, properties: nil)
      expect(message.delivery).not_to be_redelivered
    end

    it "makes a fresh UUIDv7 without id:, and no id at all with id: nil" do
      expect(acemq_message.id).to match(/\A\h{8}-\h{4}-7\h{3}-\h{4}-\h{12}\z/)
      expect(acemq_message.id).not_to eq(acemq_message.id)
      expect(acemq_message(id: nil).id).to be_nil
    end

    it "refuses a payload that cannot be JSON, as publish would" do
      expect { acemq_message({ "amount" => Float::NAN }) }
        .to raise_error(AceMQ::AMQP::EncodingError, /cannot be sent as JSON/)
    end

    it "is what a handler's #call takes" do
      consumer = accepting.new
      expect(consumer.call(acemq_message({ "order_id" => "A-1" }))).to be_accept
    end
  end

  describe "#deliver" do
    it "runs the class on its own thread, on the example's broker, with its topology declared" do
      outcome = deliver(accepting, { order_id: "A-1" }, id: "m-1", type: "order.placed.v1")

      expect(outcome).to be_accepted
      expect(outcome).not_to be_duplicate
      expect([outcome.attempt, outcome.ack, outcome.reason]).to eq([1, AceMQ::AMQP::Ack.accept, nil])
      expect(outcome.inspect).to match(/#<AceMQ::Testing::Outcome KitConsumer\h+ message "m-1": accepted on attempt 1>/)
      message, thread = AceMQ::RSpec::Harness.current.run_for(accepting).instance.seen.last
      expect(thread).not_to eq(Thread.current)
      expect([message.payload, message.id, message.type]).to eq([{ "order_id" => "A-1" }, "m-1", "order.placed.v1"])
      expect(message.delivery.queue).to eq("kit.accepting")
      expect(acemq_broker.queue_depth("kit.accepting.dlq")).to eq(ready: 0, unacked: 0)
    end

    it "keeps one instance for the example, as the runner does, or the one given" do
      deliver(accepting, {})
      deliver(accepting, {})
      expect(AceMQ::RSpec::Harness.current.run_for(accepting).instance.seen.size).to eq(2)

      mine = flaky.new
      deliver(flaky, {}, instance: mine)
      expect(AceMQ::RSpec::Harness.current.run_for(flaky).instance).to be(mine)
      expect { deliver(flaky, {}, instance: flaky.new) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /already runs on .* pass instance: on the first deliver/)
    end

    it "tells a duplicate from a first delivery under the idempotent macro" do
      store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new
      charges = []
      klass = consumer_class do
        queue "kit.idempotent"
        idempotent store: store
        define_method(:call) do |message|
          charges << message.payload["order_id"]
          accept
        end
      end

      outcomes = Array.new(3) { deliver(klass, { "order_id" => "A-1" }, id: "m-1") }

      expect(outcomes.map(&:kind)).to eq(%i[accepted duplicate duplicate])
      expect(outcomes).to all(be_accepted)
      expect(outcomes.last.inspect).to include("duplicate on attempt 1 (accepted without running the handler)")
      expect(charges).to eq(["A-1"])
      expect(deliver(klass, { "order_id" => "A-1" }, id: "m-2")).not_to be_duplicate
    end

    it "tells a duplicate from a first delivery when #call wraps itself, as the guide's consumer does" do
      store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new
      klass = consumer_class do
        queue "kit.wrapped"
        define_method(:call) { |message| (@once ||= AceMQ::AMQP::Patterns.idempotent(store) { |_| accept }).call(message) }
      end

      expect(deliver(klass, {}, id: "m-1")).not_to be_duplicate
      expect(deliver(klass, {}, id: "m-1")).to be_duplicate
    end

    it "walks a message up the class's ladder with the broker's clock, to the DLQ" do
      first = deliver(flaky, { "order_id" => "A-1" }, id: "m-1")
      expect(first).to be_retried
      expect([first.rung, first.attempt, first.reason]).to eq([1, 1, "gateway down"])
      expect(first.inspect).to end_with('retried after attempt 1, waiting in rung 1: "gateway down">')

      # The first rung is 60 s: 30 of them bring nothing back.
      waiting = first.advance_clock(30)
      expect(waiting).to be_waiting
      expect(waiting.rung).to eq(1)
      expect(waiting.inspect).to include("still waiting in rung 1")

      second = waiting.advance_clock(30)
      expect([second.kind, second.rung, second.attempt]).to eq([:retried, 2, 2])

      last = second.next_attempt
      expect(last).to be_dead_lettered
      expect([last.attempt, last.reason]).to eq([3, "retries exhausted after 3 attempts: gateway down"])
      expect(last.dead_letter).to have_attributes(id: "m-1", attempt: 3, body: '{"order_id":"A-1"}')
      expect(last.history.map(&:kind)).to eq(%i[retried retried dead_lettered])
      expect(acemq_broker.queue_depth("kit.flaky.dlq")).to eq(ready: 1, unacked: 0)
    end

    it "follows the ladder to the end with last_attempt" do
      last = deliver(flaky, {}).last_attempt
      expect(last).to be_dead_lettered
      expect(last.history.size).to eq(3)
      expect { last.advance_clock(1) }.to raise_error(AceMQ::AMQP::ConfigurationError, /is not waiting in a rung/)
      expect(deliver(accepting, {}).last_attempt).to be_accepted
    end

    it "says what a handler raised: a retry with the error, FatalError a dead letter at once" do
      klass = consumer_class do
        queue "kit.raising"
        retries max_attempts: 2
        def call(message)
          raise AceMQ::AMQP::FatalError, "no such order" if message.payload["fatal"]

          raise ArgumentError, "bad amount"
        end
      end

      retried = deliver(klass, {})
      expect(retried).to be_retried
      expect(retried.error).to be_a(ArgumentError)
      expect([retried.reason, retried.error_class]).to eq(["ArgumentError: bad amount", "ArgumentError"])

      rejected = deliver(klass, { "fatal" => true })
      expect(rejected).to be_dead_lettered
      expect([rejected.attempt, rejected.error_class]).to eq([1, "AceMQ::AMQP::FatalError"])
      expect(rejected.reason).to include("no such order")
    end

    it "dead-letters a reject with its reason, and a return that is not an Ack with what it was" do
      klass = consumer_class do
        queue "kit.rejecting"
        def call(message) = message.payload["ok"] ? :ok : reject("no such order")
      end

      expect(deliver(klass, {}).reason).to eq("no such order")
      not_an_ack = deliver(klass, { "ok" => true })
      expect(not_an_ack).to be_dead_lettered
      expect(not_an_ack.reason).to include(":ok (Symbol)")
    end

    it "routes through the class's bindings with exchange: and routing_key:" do
      klass = consumer_class do
        queue "kit.bound"
        bind "kit-events", routing_key: "order.*"
        def call(_message) = accept
      end

      expect(deliver(klass, {}, exchange: "kit-events", routing_key: "order.placed")).to be_accepted
      expect(deliver(klass, acemq_message({}, exchange: "kit-events", routing_key: "order.paid"))).to be_accepted
      expect { deliver(klass, {}, exchange: "kit-events", routing_key: "invoice.sent") }
        .to raise_error(AceMQ::AMQP::Unroutable, /routing key 'invoice.sent'/)

      # What the code published on an exchange goes the same way.
      AceMQ::Rails.publisher.publish({}, exchange: "kit-events", to: "invoice.sent")
      expect { deliver(klass, acemq_published.last) }.to raise_error(AceMQ::AMQP::Unroutable)
    end

    it "hands a batching class its deliveries through the guard, one outcome each" do
      store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new
      klass = consumer_class do
        queue "kit.batch"
        batch 10
        idempotent store: store
        def call(_message) = accept
      end

      expect(deliver(klass, {}, id: "m-1")).to be_accepted
      expect(deliver(klass, {}, id: "m-1")).to be_duplicate
    end

    it "delivers a message built by hand, keeping its envelope, and one the code published" do
      message = acemq_message({ "order_id" => "A-1" }, id: "m-7", type: "order.placed.v1", headers: { "trace" => "t" })
      deliver(accepting, message)
      AceMQ::Rails.publisher.publish({ "order_id" => "A-2" }, to: "elsewhere", type: "order.placed.v1")
      deliver(accepting, acemq_published.last)

      seen = AceMQ::RSpec::Harness.current.run_for(accepting).instance.seen.map(&:first)
      expect(seen.map { |m| [m.id, m.type, m.headers, m.payload] })
        .to eq([["m-7", "order.placed.v1", { "trace" => "t" }, { "order_id" => "A-1" }],
                [acemq_published.last.id, "order.placed.v1", {}, { "order_id" => "A-2" }]])
      expect(seen.map(&:attempt)).to eq([1, 1])
    end

    it "handles what was already in the queue first, and measures only its own message" do
      acemq_declare(accepting)
      acemq_broker.publish({ "early" => true }, to: "kit.accepting")

      expect(deliver(accepting, { "late" => true })).to be_accepted
      expect(AceMQ::RSpec::Harness.current.run_for(accepting).instance.seen.map { |m, _| m.payload })
        .to eq([{ "early" => true }, { "late" => true }])
    end

    it "fails the example, saying where the message is, when the handler never settles it" do
      gate = Queue.new
      klass = consumer_class do
        queue "kit.stuck"
        define_method(:call) { |_| gate.pop || accept }
      end

      message = failure_of { deliver(klass, {}, id: "m-1", timeout: 0.2) }
      gate << nil

      expect(message).to start_with('KitConsumer').and include('did not settle message "m-1" within 0.2s')
      # The depths as Ruby inspects a Hash: {:ready=>0, ...} up to 3.3,
      # {ready: 0, ...} from 3.4.
      expect(message).to include("kit.stuck: #{{ ready: 0, unacked: 1 }.inspect}").and include("is its handler blocked")
    end

    it "refuses what is not a consumer class" do
      expect { deliver(Object, {}) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /deliver needs a consumer class .* got Object/)
      abstract = consumer_class { retries max_attempts: 2 }
      expect { deliver(abstract, {}) }.to raise_error(AceMQ::AMQP::ConfigurationError, /has no queue/)
    end
  end

  describe "the publisher" do
    it "is AceMQ::Rails.publisher during the example, and records what a handler publishes" do
      klass = consumer_class do
        queue "kit.publishing"
        def call(message)
          publish({ "order_id" => message.payload["order_id"] }, to: "kit.shipping", type: "shipment.due.v1")
          accept
        end
      end

      expect(AceMQ::Rails.publisher).to be(acemq_publisher)
      deliver(klass, { "order_id" => "A-1" })

      published = acemq_published.last
      expect([published.to, published.exchange, published.type, published.payload])
        .to eq(["kit.shipping", "", "shipment.due.v1", { "order_id" => "A-1" }])
      expect(published.id).to match(/\A\h{8}-/)
    end

    it "records a publish nothing in the example takes as unrouted, and returns its envelope" do
      envelope = AceMQ::Rails.publisher.publish({ id: 1 }, exchange: "nowhere", to: "order.placed",
                                                           type: "order.placed.v1", headers: { "trace" => "t" })

      expect([envelope.type, envelope.headers, envelope.origin]).to eq(["order.placed.v1", { "trace" => "t" }, "rspec:publish"])
      published = acemq_published.last
      expect(published).not_to be_routed
      expect(published.envelope).to be(envelope)
      expect(published.inspect).to eq(%(on "nowhere" to "order.placed" type="order.placed.v1" payload=#{{ 'id' => 1 }.inspect} ) +
                                      %(headers=#{{ 'trace' => 't' }.inspect} (unrouted: nothing in this test takes it)))
    end

    it "routes into the queues the example declares" do
      acemq_declare(accepting)
      AceMQ::Rails.publisher.publish({}, to: "kit.accepting")

      expect(acemq_published.last).to be_routed
      expect(acemq_broker.queue_depth("kit.accepting")).to eq(ready: 1, unacked: 0)
    end

    it "raises on a payload that is not JSON, and keeps it as refused" do
      expect { AceMQ::Rails.publisher.publish({ "x" => Float::NAN }, to: "q") }.to raise_error(AceMQ::AMQP::EncodingError)
      expect(acemq_published).to be_empty
      expect(acemq_publisher.refused.map(&:error)).to all(be_a(AceMQ::AMQP::EncodingError))
    end

    it "records a batch when it is sent, with the envelopes b.publish returned" do
      envelopes = []
      count = AceMQ::Rails.publisher.batch do |b|
        envelopes << b.publish({ "n" => 1 }, to: "q")
        envelopes << b.publish({ "n" => 2 }, to: "q", type: "t.v1")
        expect(acemq_published).to be_empty
      end

      expect(count).to eq(2)
      expect(acemq_published.map(&:id)).to eq(envelopes.map(&:id))
      expect(acemq_published.map(&:type)).to eq([nil, "t.v1"])
      expect(acemq_published.map(&:payload)).to eq([{ "n" => 1 }, { "n" => 2 }])
      expect { AceMQ::Rails.publisher.batch { |b| b.publish(Float::NAN, to: "q") } }
        .to raise_error(AceMQ::AMQP::EncodingError)
    end

    it "stays open when code under test closes it" do
      AceMQ::Rails.publisher.close
      expect(AceMQ::Rails.publisher).to be(acemq_publisher)
      expect { AceMQ::Rails.publisher.publish({}, to: "q") }.to have_published.to("q")
    end
  end

  describe "#have_published" do
    def place(id = "A-1", publisher: AceMQ::Rails.publisher)
      publisher.publish({ order_id: id, amount_cents: 1299 }, exchange: "orders-events", to: "order.placed",
                                                               type: "order.placed.v1", headers: { "trace" => "t-1" })
    end

    it "matches what the block published, by payload, exchange, routing key, type and headers" do
      expect { place }.to have_published
      expect { place }.to have_published("order_id" => "A-1", "amount_cents" => 1299)
      expect { place }.to have_published(order_id: "A-1", amount_cents: 1299)
      expect { place }.to have_published(hash_including("order_id" => "A-1"))
      expect { place }.to have_published(hash_including(order_id: "A-1"))
      expect { place }.to have_published.on("orders-events")
      expect { place }.to have_published.on("orders-events").to("order.placed")
      expect { place }.to have_published.on("orders-events").to(/\Aorder\./)
      expect { place }.to have_published.with_type("order.placed.v1").with_headers("trace" => "t-1")
      expect { place }.to have_published.with_headers(trace: a_string_starting_with("t-"))
    end

    it "counts: exactly once unless told otherwise" do
      expect { 2.times { place } }.to have_published.twice
      expect { 3.times { place } }.to have_published.exactly(3).times
      expect { 3.times { place } }.to have_published.at_least(2).times
      expect { place }.to have_published.at_most(:twice)
      expect { nil }.to have_published.exactly(0).times

      message = failure_of { expect { 2.times { place } }.to have_published.on("orders-events") }
      expect(message).to start_with('expected the block to publish once on "orders-events", but it published it twice.')
    end

    it "fails with what was published instead" do
      message = failure_of do
        expect { place("A-2") }.to have_published(hash_including("order_id" => "A-1")).on("orders-events")
      end

      # Hashes as this Ruby inspects them.
      expect(message).to eq(<<~TEXT.chomp)
        expected the block to publish once on "orders-events" with payload hash_including(#{{ 'order_id' => 'A-1' }.inspect[1..-2]}), but it published it 0 times.
        Published (1):
          on "orders-events" to "order.placed" type="order.placed.v1" payload=#{{ 'order_id' => 'A-2', 'amount_cents' => 1299 }.inspect} headers=#{{ 'trace' => 't-1' }.inspect} (unrouted: nothing in this test takes it)
      TEXT
    end

    it "fails on the wrong queue, type or headers, and says when nothing was published" do
      expect(failure_of { expect { place }.to have_published.to("order.placed") })
        .to start_with('expected the block to publish once to "order.placed", but it published it 0 times.')
      expect(failure_of { expect { place }.to have_published.with_type("order.paid.v1") })
        .to start_with('expected the block to publish once anything with type "order.paid.v1"')
      expect(failure_of { expect { place }.to have_published.with_headers("trace" => "t-2") })
        .to include("with headers #{{ 'trace' => 't-2' }.inspect}, but it published it 0 times")
      expect(failure_of { expect { nil }.to have_published.to("q") })
        .to eq("expected the block to publish once to \"q\", but it published it 0 times.\nNothing was published.")
    end

    it "counts only what the block published" do
      place
      expect { nil }.not_to have_published
      expect { place("A-9") }.to have_published(hash_including("order_id" => "A-9"))
    end

    it "lists refused publishes in its failure message and never counts them" do
      message = failure_of do
        expect do
          AceMQ::Rails.publisher.publish({ "amount" => Float::NAN }, to: "q")
        rescue AceMQ::AMQP::EncodingError
          nil
        end.to have_published.to("q")
      end

      expect(message).to include("Nothing was published.\nRefused, so not published (1):\n  to \"q\"")
      expect(message).to include("(refused: AceMQ::AMQP::EncodingError: the payload cannot be sent as JSON")
    end

    it "negated, passes when nothing matched and fails listing what did" do
      expect { place }.not_to have_published.to("q")
      message = failure_of { expect { place }.not_to have_published.on("orders-events") }
      expect(message).to start_with('expected the block not to publish on "orders-events", but it published it once.')
      expect(message).to include("Published (1):")
      expect { expect { place }.not_to have_published.twice }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /ambiguous/)
    end

    it "matches the publisher or its publishes as a value" do
      place
      place("A-2")
      expect(acemq_publisher).to have_published(hash_including("order_id" => "A-2"))
      expect(acemq_published).to have_published.on("orders-events").twice
      expect(failure_of { expect(acemq_publisher).to have_published.to("q") })
        .to start_with('expected the publisher to publish once to "q"')
      expect { expect(42).to have_published }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /looked for in a block, acemq_publisher or acemq_published, got 42/)
    end

    it "describes itself" do
      expect(have_published(hash_including("a" => 1)).on("ev").to("k").with_type("t.v1").at_least(:once).description)
        .to eq(%(publish at least once on "ev" with routing key "k" with type "t.v1" with payload hash_including(#{{ 'a' => 1 }.inspect[1..-2]})))
    end
  end

  describe "#eventually" do
    it "returns the first truthy value, and fails after the timeout with the last one" do
      calls = 0
      expect(eventually { (calls += 1) >= 3 && calls }).to eq(3)
      expect(failure_of { eventually(timeout: 0.05) { nil } }).to eq("condition not met within 0.05s (last: nil)")
    end
  end

  # Driven by hand: these examples have no harness of their own.
  describe "between examples", acemq: false do
    after { AceMQ::Rails.publisher = nil }

    it "has no broker under acemq: false, and says so" do
      expect { acemq_broker }.to raise_error(AceMQ::AMQP::ConfigurationError, /turned off for this test \(`acemq: false` in RSpec/)
      expect { expect { nil }.to have_published }.to raise_error(AceMQ::AMQP::ConfigurationError, /acemq: false/)
    end

    it "gives each example a broker of its own, emptied afterwards, and puts the publisher back" do
      before = AceMQ::AMQP::Connection.open(memory_url)
      AceMQ::Rails.publisher = before

      first = AceMQ::RSpec::Harness.start
      expect(AceMQ::Rails.publisher).to be(first.publisher)
      first.declare(AceMQ::AMQP::Topology.new.queue("kept"))
      AceMQ::Rails.publisher.publish({}, to: "kept")
      AceMQ::RSpec::Harness.stop

      expect(AceMQ::Rails.publisher).to be(before)
      expect(AceMQ::RSpec::Harness.current).to be_nil
      expect(AceMQ::AMQP::Connection.open(first.url).queue_depth("kept")).to be_nil
      second = AceMQ::RSpec::Harness.start
      expect(second.url).not_to eq(first.url)
    ensure
      AceMQ::RSpec::Harness.stop
      before&.close
    end

    it "stops the consumers an example started" do
      harness = AceMQ::RSpec::Harness.start
      run = harness.run_for(accepting)
      AceMQ::RSpec::Harness.stop
      expect(run.subscription).to be_cancelled
    end
  end

  describe "loading" do
    def ruby(code)
      out, status = Open3.capture2e(RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-e", code)
      expect(status).to be_success, out
      out
    end

    it "is not loaded by require \"acemq\", and loads neither Rails nor rspec-rails" do
      expect(ruby('require "acemq"; print defined?(AceMQ::RSpec).inspect')).to eq("nil")
      # A group defined after the require has the helpers: the kit configured RSpec.
      expect(ruby('require "acemq/rspec"; print [defined?(::Rails::Railtie), defined?(::RSpec::Rails), ' \
                  'RSpec.describe("x").include?(AceMQ::RSpec::Helpers)].inspect'))
        .to eq("[nil, nil, true]")
    end
  end
end
