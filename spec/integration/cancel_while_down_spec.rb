# frozen_string_literal: true

# A subscription whose queue is gone subscribes again and again, backing off
# from 100 ms to 5 s. Cancelling it must not wait out that pause: the soak
# (rake soak) saw a cancel take 4.3 s after 7 s without the queue.
RSpec.describe "cancelling a subscription whose queue is gone" do
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:queue) { unique("down") }
  after { mq.close }

  it "returns within a second however long it has been backing off" do
    topology = AceMQ::AMQP::Topology.new.queue(queue)
    topology.apply(mq)
    sub = mq.consume(queue, on_error: ->(_) {}) { AceMQ::AMQP::Ack.accept }
    topology.teardown(mq, force: true)
    eventually(timeout: 20) { sub.down_for.to_f >= 7 }
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    sub.cancel
    took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
    expect(took).to be < 1.0
    expect(sub).to be_cancelled
  end
end
