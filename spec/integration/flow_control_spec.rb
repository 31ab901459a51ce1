# frozen_string_literal: true

require_relative "../../drill/support"
require_relative "../../drill/node"

# A broker under a memory alarm blocks publishing connections. On a private
# node with its memory watermark lowered (the shared broker is left alone):
# a publish waits up to its deadline and raises Blocked, unsent; a consumer
# on a connection of its own keeps draining; lifting the alarm lets the
# publisher go on.
RSpec.describe "flow control (a private RabbitMQ node under a memory alarm)" do
  before(:all) do
    @node = Drill::Node.new
    @node.start
  end

  after(:all) { @node&.destroy }

  let(:queue) { unique("blocked") }

  it "raises Blocked for a publish past its deadline, unsent, while a consumer keeps draining" do
    publisher = AceMQ::AMQP::Connection.open(@node.url, origin: unique("publisher"), confirm_timeout: 1)
    consumer = AceMQ::AMQP::Connection.open(@node.url, origin: unique("consumer"))
    AceMQ::AMQP::Topology.new.queue(queue).apply(consumer)
    3.times { |n| publisher.publish({ "n" => n }, to: queue) }
    expect(publisher).not_to be_blocked

    @node.ctl!("set_vm_memory_high_watermark", "0.000001")
    begin
      # The broker blocks a connection at its next publish: the first one may
      # be the one that finds the alarm.
      error = eventually(timeout: 15) do
        publisher.publish({ "n" => 99 }, to: queue)
        nil
      rescue AceMQ::AMQP::Blocked => e
        e
      end
      expect(error.message).to include("blocking publishers", "did not lift it within")
      expect(publisher).to be_blocked

      got = Queue.new
      sub = consumer.consume(queue) { |m| got << m.payload["n"]; AceMQ::AMQP::Ack.accept }
      expect(Array.new(3) { eventually { got.pop(true) rescue nil } }.sort).to eq([0, 1, 2])
      expect(consumer).not_to be_blocked # it never published

      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      expect { publisher.publish({ "n" => 100 }, to: queue) }.to raise_error(AceMQ::AMQP::Blocked, /was not sent/)
      expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0).to be_between(0.9, 5)
    ensure
      @node.ctl!("set_vm_memory_high_watermark", "0.4")
    end

    eventually(timeout: 15) { !publisher.blocked? }
    publisher.publish({ "n" => 4 }, to: queue)
    eventually(timeout: 10) { (got.pop(true) rescue nil) == 4 }
    sub.cancel
    publisher.close
    consumer.close
  end
end
