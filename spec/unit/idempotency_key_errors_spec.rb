# frozen_string_literal: true

require "acemq/amqp/patterns"

# A key: function that raises, or a key that is not UTF-8 text, is as
# deterministic as a missing key: the message is rejected as fatal with the
# reason, alone or in a batch, and the messages around it are handled.
RSpec.describe "idempotency keys that cannot be had" do
  let(:mq) { AceMQ::AMQP::Connection.open(memory_url) }
  let(:queue) { unique("keys") }
  let(:store) { AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
  after { mq.close }

  [1, 10].each do |batch|
    it "rejects them as fatal with batch: #{batch}, and handles the good ones around them" do
      handled = Queue.new
      key = lambda do |m|
        case m.payload["k"]
        when "raise" then raise ArgumentError, "no order id"
        when "bytes" then "\xFF\xFEkey".b
        else "order:#{m.payload['n']}"
        end
      end
      sub = mq.consume(queue, batch: batch, &AceMQ::AMQP::Patterns.idempotent(store, key: key) do |m|
        handled << m.payload["n"]
        AceMQ::AMQP::Ack.accept
      end)
      [{ "n" => 1 }, { "n" => 2, "k" => "raise" }, { "n" => 3, "k" => "bytes" }, { "n" => 4 }].each { |p| mq.publish(p, to: queue) }
      eventually { sub.stats[:accepted] == 2 && sub.stats[:dead_lettered] == 2 }
      expect(sub).to be_alive
      expect(sub.stats[:retried]).to eq(0) # fatal, not a climb up the ladder
      expect(Array.new(handled.size) { handled.pop }.sort).to eq([1, 4])
      reasons = mq.peek_dead_letters(queue, limit: 10).map(&:reason)
      expect(reasons).to contain_exactly(a_string_including("key: raised ArgumentError: no order id"),
                                         a_string_including("key is not UTF-8 text"))
      sub.cancel
    end
  end
end
