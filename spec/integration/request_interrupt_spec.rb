# frozen_string_literal: true

require "timeout"

# A request cut short by Ruby itself (Timeout.timeout, Thread#kill), from the
# break-it run on issue 49 part 3. The engine waited with
# rb_thread_call_without_gvl, which runs Ruby's interrupts as it takes the
# GVL back: the exception jumped over the Rust frames without dropping the
# request. A first request cut while it opened the reply channel kept that
# channel's lock for ever, and every later request on the connection hung
# past its own timeout (8 of 8 at 0.5 ms); a cut request's waiter was never
# removed, so its reply was not counted late and its memory was never freed.
RSpec.describe "a request interrupted by Ruby" do
  let(:queue) { unique("req-cut") }
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("req-cut-spec")) }
  let(:responder) { AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("req-cut-responder")) }
  let(:answered) { Queue.new }

  before do
    AceMQ::AMQP::Topology.new.queue(queue).apply(responder)
    @sub = responder.consume(queue, concurrency: 2) do |m|
      answered << m.payload["n"]
      responder.reply(m, { "n" => m.payload["n"] })
      AceMQ::AMQP::Ack.accept
    end
  end

  after do
    @sub&.cancel
    mq.close
    responder.close
  end

  # A request on its own thread, joined with a bound: a hang fails the
  # example instead of the suite.
  def bounded_request(conn, n, timeout:)
    t = Thread.new { conn.request({ "n" => n }, to: queue, timeout: timeout) }
    t.join(timeout + 10) or (t.kill && raise("the request hung past its timeout of #{timeout} s"))
    t.value
  end

  it "leaves a connection whose first request was cut able to ask again" do
    5.times do |round|
      conn = AceMQ::AMQP::Connection.open(AMQP_URL, origin: unique("req-cut-first"))
      begin
        begin
          Timeout.timeout(0.0005) { conn.request({ "n" => -1 }, to: queue, timeout: 5) }
        rescue Timeout::Error
          nil
        end
        expect(bounded_request(conn, round, timeout: 3).payload).to eq("n" => round)
      ensure
        conn.close
      end
    end
  end

  it "counts the reply of a cut request late, and keeps no waiter for it" do
    expect(bounded_request(mq, 0, timeout: 5).payload).to eq("n" => 0) # the reply channel is open
    cut = 300
    cut.times do |n|
      Timeout.timeout(0.0003) { mq.request({ "n" => n + 1 }, to: queue, timeout: 5) }
    rescue Timeout::Error
      nil
    end
    # Every cut request that reached the responder was answered, and an
    # answer that came after its request was gone is late. Not all of them:
    # Timeout can also strike after the reply was taken, as the request
    # returns (then it is not late). Before the fix none was ever counted
    # (0 of 4,000 in the break-it run): the cut requests' waiters stayed.
    eventually(timeout: 20) { mq.late_replies >= (answered.size - 1) / 2 && mq.late_replies <= answered.size - 1 }
    expect(answered.size).to be > 1
    expect(bounded_request(mq, -2, timeout: 5).payload).to eq("n" => -2)
  end
end
