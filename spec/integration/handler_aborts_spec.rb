# frozen_string_literal: true

# A handler that does not return: it raises an exception that is not a
# StandardError (only a StandardError is a handler's failure, and the rest
# is never swallowed), or its thread is killed. In issue 47's hostile run
# two `raise Exception` left a subscription of two threads with none, its
# failure nil, on_error never called and 32 messages held unacknowledged
# until cancel. Now each such message goes round the retry ladder with the
# reason, on_error hears of it, and a fresh thread takes the dead one's
# place. On memory:// and RabbitMQ.
RSpec.describe "a handler that does not return" do
  [["memory://", -> { "memory://aborts-#{SecureRandom.hex(4)}" }], ["RabbitMQ", -> { AMQP_URL }]].each do |name, url|
    context "on #{name}" do
      let(:mq) { AceMQ::AMQP::Connection.open(url.call) }
      let(:queue) { unique("aborts") }

      before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
      after { mq.close }

      def run(mq, queue, total:, &abort_first)
        done = Queue.new
        errors = Queue.new
        calls = 0
        lock = Mutex.new
        sub = mq.consume(queue, concurrency: 2, on_error: ->(e) { errors << e }) do |m|
          n = lock.synchronize { calls += 1 }
          abort_first.call(n)
          done << m.payload["n"]
          AceMQ::AMQP::Ack.accept
        end
        total.times { |n| mq.publish({ "n" => n }, to: queue) }
        [sub, done, errors]
      end

      it "sends a message whose handler raised Exception round the ladder and replaces the thread" do
        sub, done, errors = run(mq, queue, total: 20) { |n| raise Exception, "not a StandardError" if n <= 2 }
        seen = []
        eventually(timeout: 15) do
          seen << done.pop until done.empty?
          seen.sort.uniq == (0...20).to_a
        end
        expect(seen.size).to eq(20) # each once: the two aborted ran again, not twice
        expect(sub.dead_workers).to eq(0)
        expect(sub.concurrency).to eq(2)
        aborted = []
        aborted << errors.pop until errors.empty?
        aborted.select! { |e| e.is_a?(AceMQ::AMQP::HandlerAborted) }
        expect(aborted.size).to eq(2)
        expect(aborted.first.message).to include("Exception: not a StandardError", "retry ladder")
        expect(sub.stats[:retried]).to eq(2)
        sub.cancel
        expect(mq.queue_counts(queue)[:ready]).to eq(0)
      end

      it "does the same for a handler whose thread is killed" do
        sub, done, errors = run(mq, queue, total: 10) { |n| Thread.current.kill if n == 1 }
        seen = []
        eventually(timeout: 15) do
          seen << done.pop until done.empty?
          seen.sort == (0...10).to_a
        end
        expect(sub.dead_workers).to eq(0)
        aborted = []
        aborted << errors.pop until errors.empty?
        expect(aborted.grep(AceMQ::AMQP::HandlerAborted).map(&:message)).to all(include("its thread was killed"))
        sub.cancel
      end
    end
  end

  # Ruby kills the other threads when the process exits (SIGTERM's default,
  # or the main thread returning): that is no handler failing. Each held
  # message stays unacknowledged and the broker gives it back when the
  # connection goes, with no attempt spent and no fresh thread started (the
  # break-it run of issue 52 saw four "the handler did not return" and
  # "can't alloc thread" on every TERM). Two processes.
  it "leaves the held messages to the broker when the process exits under TERM, and says nothing" do
    mq = AceMQ::AMQP::Connection.open(AMQP_URL)
    queue = unique("aborts-exit")
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    child = <<~'RUBY'
      require "acemq/amqp"
      $stdout.sync = true
      mq = AceMQ::AMQP::Connection.open(ENV.fetch("AMQP_URL"))
      mq.consume(ARGV[0], concurrency: 4) do |m|
        puts "handling #{m.payload['n']}"
        sleep 60
        AceMQ::AMQP::Ack.accept
      end
      sleep
    RUBY
    out_r, out_w = IO.pipe
    err_r, err_w = IO.pipe
    pid = Process.spawn({ "AMQP_URL" => AMQP_URL }, RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-e", child,
                        queue, out: out_w, err: err_w)
    out_w.close
    err_w.close
    4.times { |n| mq.publish({ "n" => n }, to: queue) }
    handling = 4.times.map { Timeout.timeout(20) { out_r.gets } }
    expect(handling.map(&:strip).sort).to eq((0..3).map { |n| "handling #{n}" })
    Process.kill("TERM", pid)
    _, status = Process.wait2(pid)
    stderr = err_r.read
    expect(status.termsig).to eq(Signal.list["TERM"])
    expect(stderr).not_to include("did not return")
    expect(stderr).not_to include("can't alloc thread")

    got = Queue.new
    sub = mq.consume(queue, concurrency: 4) { |m| got << [m.payload["n"], m.attempt, m.delivery.redelivered?]; AceMQ::AMQP::Ack.accept }
    back = 4.times.map { Timeout.timeout(20) { got.pop } }
    sub.cancel
    # The broker's redelivery of the same messages: first attempts, not ladder copies.
    expect(back.sort).to eq((0..3).map { |n| [n, 1, true] })
  ensure
    out_r&.close
    err_r&.close
    mq&.close
  end
end
