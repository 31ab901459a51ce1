# frozen_string_literal: true

require "acemq/amqp/patterns"

# Request/reply as both transports must do it (docs/request-reply.md); the
# including group defines `url`.
RSpec.shared_examples "request/reply" do
  let(:mq) { AceMQ::AMQP::Connection.open(url) }
  let(:queue) { unique("rpc") }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }

  after do
    @subs&.each(&:cancel)
    mq.close
  end

  def serve(concurrency: 1, &block)
    (@subs ||= []) << mq.consume(queue, concurrency: concurrency, &block)
  end

  it "returns the reply as a Message, for requests in flight from 8 threads at once" do
    serve(concurrency: 4) do |m|
      mq.reply(m, { "square" => m.payload["n"]**2 }, type: "square.v1")
      AceMQ::AMQP::Ack.accept
    end
    replies = Array.new(8) { |t| Thread.new { Array.new(10) { |i| n = t * 10 + i; [n, mq.request({ "n" => n }, to: queue)] } } }
                   .flat_map(&:value)
    expect(replies.size).to eq(80)
    replies.each do |n, reply|
      expect(reply).to be_a(AceMQ::AMQP::Message)
      expect(reply.payload).to eq("square" => n * n)
      expect(reply.type).to eq("square.v1")
      expect(reply.delivery.properties.correlation_id).to be_a(String)
    end
  end

  it "raises TimeoutError, drops and counts the late reply, and goes on answering" do
    # The handler takes the request in time and answers after its requester
    # gave up (a request still queued at its deadline is never handled:
    # "drops a request whose deadline passed").
    serve do |m|
      sleep 0.8 if m.payload["n"] == 1
      mq.reply(m, { "echo" => m.payload["n"] })
      AceMQ::AMQP::Ack.accept
    end
    expect { mq.request({ "n" => 1 }, to: queue, timeout: 0.3) }.to raise_error(AceMQ::AMQP::TimeoutError, /no reply/)
    expect(mq.late_replies).to eq(0)
    eventually { mq.late_replies == 1 }
    expect(mq.request({ "n" => 2 }, to: queue).payload).to eq("echo" => 2)
  end

  it "refuses a reply to a published message and a bad timeout, and answers before and after" do
    published = Queue.new
    serve do |m|
      if m.delivery.properties.reply_to
        mq.reply(m, { "ok" => m.payload["n"] })
      else
        published << (begin
          mq.reply(m, {})
        rescue AceMQ::AMQP::ConfigurationError => e
          e
        end)
      end
      AceMQ::AMQP::Ack.accept
    end
    expect(mq.request({ "n" => 1 }, to: queue).payload).to eq("ok" => 1)
    mq.publish({ "n" => 2 }, to: queue)
    expect(eventually { published.pop(true) rescue nil }.message).to match(/no reply_to/)
    expect { mq.request({}, to: queue, timeout: 0) }.to raise_error(AceMQ::AMQP::ConfigurationError, /above 0/)
    expect { mq.request({}, to: unique("nobody")) }.to raise_error(AceMQ::AMQP::Unroutable)
    expect(mq.request({ "n" => 3 }, to: queue).payload).to eq("ok" => 3)
  end

  it "composes with the idempotent guard: a duplicate request is not handled again and gets no reply" do
    store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new
    charged = []
    serve(&AceMQ::AMQP::Patterns.idempotent(store) do |m|
      charged << m.payload["order_id"]
      mq.reply(m, { "charged" => charged.size })
      AceMQ::AMQP::Ack.accept
    end)
    envelope = AceMQ::AMQP::Envelope.new(id: unique("req"), type: "charge.v1")
    expect(mq.request({ "order_id" => "A-1" }, to: queue).payload).to eq("charged" => 1)
    # The same request again (the same envelope id twice, as a redelivery or
    # a requester's retry is): one charge, and the duplicate is accepted
    # unanswered, so its requester times out.
    expect(mq.request({ "order_id" => "B-1" }, to: queue, envelope: envelope).payload).to eq("charged" => 2)
    expect { mq.request({ "order_id" => "B-1" }, to: queue, envelope: envelope, timeout: 0.5) }
      .to raise_error(AceMQ::AMQP::TimeoutError)
    expect(charged).to eq(%w[A-1 B-1])
  end

  # Every copy a failed request could leave: the queue, the default
  # ladder's rungs (1, 2, 4 and 8 s) and the DLQ.
  def copies_left
    names = [queue, "#{queue}.dlq", *%w[1 2 4 8].map { |s| "#{queue}.retry.#{s}s" }]
    mq.queue_counts_many(names).sum { |_, c| c ? c[:ready] : 0 }
  end

  def failing_charge(m)
    raise ArgumentError, "qty must be positive, got #{m.payload["qty"]}" # RAISE_LINE
  end

  it "answers a raising responder at once with RemoteError (class, message, frames), and leaves no copy" do
    handled = Queue.new
    sub = serve do |m|
      handled << m.payload
      next AceMQ::AMQP::Ack.reject("out of stock") if m.payload["reject"]

      failing_charge(m)
    end.last
    asked = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    error = begin
      mq.request({ "qty" => -1 }, to: queue, timeout: 30)
    rescue AceMQ::AMQP::RemoteError => e
      e
    end
    took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - asked
    expect(error).to be_a(AceMQ::AMQP::RemoteError)
    expect(took).to be < 5 # not the 30 s timeout
    expect(error.remote_class).to eq("ArgumentError")
    expect(error.message).to eq("qty must be positive, got -1")
    raise_line = File.readlines(__FILE__).index { |l| l.include?("# RAISE_" + "LINE") } + 1
    expect(error.remote_backtrace.first).to start_with("#{__FILE__}:#{raise_line}:in ")
    expect(error.backtrace.first).to eq(error.remote_backtrace.first)
    expect(error.remote_backtrace.size).to be <= 21 # 20 frames and a "… N more" line
    # Below the responder's frames, the requester's own.
    expect(error.backtrace.drop(error.remote_backtrace.size).join("\n")).to include(File.basename(__FILE__))

    expect { mq.request({ "reject" => true }, to: queue, timeout: 30) }
      .to raise_error(AceMQ::AMQP::RemoteError) { |e|
        expect([e.remote_class, e.message, e.remote_backtrace]).to eq([nil, "out of stock", []])
      }
    eventually { sub.stats[:error_replied] == 2 }
    expect(sub.stats).to include(retried: 0, dead_lettered: 0, expired: 0)
    expect(copies_left).to eq(0)
    expect(handled.size).to eq(2)
  end

  it "drops a request whose deadline passed while its consumer was paused: never handled, counted, not dead-lettered" do
    handled = []
    outcomes = []
    events = AceMQ.subscribe("process.acemq") { |e| outcomes << e[:outcome] if e[:queue] == queue }
    sub = serve do |m|
      handled << m.payload["n"]
      mq.reply(m, { "n" => m.payload["n"] })
      AceMQ::AMQP::Ack.accept
    end.last
    sub.pause
    eventually { sub.paused? }
    expect { mq.request({ "n" => 1 }, to: queue, timeout: 0.3) }.to raise_error(AceMQ::AMQP::TimeoutError)
    sub.resume
    expect(mq.request({ "n" => 2 }, to: queue, timeout: 10).payload).to eq("n" => 2)
    eventually { sub.stats[:expired] == 1 && sub.stats[:accepted] == 1 }
    eventually { outcomes.sort == %w[accepted expired] }
    expect(handled).to eq([2])
    expect(sub.stats).to include(retried: 0, dead_lettered: 0, error_replied: 0)
    expect(copies_left).to eq(0)
    expect(mq.late_replies).to eq(0)
  ensure
    AceMQ.unsubscribe(events) if events
  end

  it "retries a retry_safe request that fails once and answers it normally; answers with the error once retries are spent" do
    policy = { max_attempts: 3, initial_delay: 0.2, max_delay: 0.4 }
    @subs = [mq.consume(queue, retries: policy) do |m|
      raise IOError, "attempt #{m.attempt}" if m.payload["always"] || m.attempt == 1

      mq.reply(m, { "attempt" => m.attempt })
      AceMQ::AMQP::Ack.accept
    end]
    expect(mq.request({}, to: queue, timeout: 30, retry_safe: true).payload).to eq("attempt" => 2)
    expect { mq.request({ "always" => true }, to: queue, timeout: 30, retry_safe: true) }
      .to raise_error(AceMQ::AMQP::RemoteError) { |e| expect([e.remote_class, e.message]).to eq(["IOError", "attempt 3"]) }
    # Not retry-safe: answered at the first failure.
    expect { mq.request({ "always" => true }, to: queue, timeout: 30) }
      .to raise_error(AceMQ::AMQP::RemoteError, "attempt 1")
    eventually { @subs[0].stats[:error_replied] == 2 }
    expect(@subs[0].stats).to include(retried: 3, dead_lettered: 0)
    rungs = ["#{queue}.retry.200ms", "#{queue}.retry.400ms", "#{queue}.dlq", queue]
    expect(mq.queue_counts_many(rungs).sum { |_, c| c ? c[:ready] : 0 }).to eq(0)
    expect { mq.request({}, to: queue, retry_safe: "yes") }.to raise_error(AceMQ::AMQP::ConfigurationError, /retry_safe/)
  end

  it "reads a hostile error reply between good ones as a clean RemoteError" do
    hostile = {
      "markup" => { "x-acemq-error" => { "class" => "<img src=x onerror=alert(1)>", "message" => "<script>alert(1)</script>" },
                    "x-acemq-backtrace" => "<b>frame</b>\n" * 50 },
      "odd types" => { "x-acemq-error" => { "class" => 42, "message" => { "nested" => [1, 2] } },
                       "x-acemq-backtrace" => [1, "one.rb:1", nil, { "a" => "b" }] },
      "not a table" => { "x-acemq-error" => "just text", "x-acemq-backtrace" => 7 },
      "huge" => { "x-acemq-error" => { "class" => "C" * 1000, "message" => "m\u0000" * 10_000 } },
      "none" => {}
    }
    serve do |m|
      if (kind = m.payload["hostile"])
        mq.reply(m, { "ok" => false }, type: "acemq.error", headers: hostile.fetch(kind))
      else
        mq.reply(m, { "ok" => m.payload["n"] })
      end
      AceMQ::AMQP::Ack.accept
    end
    errors = hostile.keys.to_h do |kind|
      expect(mq.request({ "n" => 1 }, to: queue).payload).to eq("ok" => 1)
      e = begin
        mq.request({ "hostile" => kind }, to: queue, timeout: 10)
      rescue AceMQ::AMQP::RemoteError => e
        e
      end
      expect(e).to be_a(AceMQ::AMQP::RemoteError)
      expect(mq.request({ "n" => 2 }, to: queue).payload).to eq("ok" => 2)
      [kind, e]
    end
    expect(errors["markup"].remote_class).to eq("<img src=x onerror=alert(1)>")
    expect(errors["markup"].message).to eq("<script>alert(1)</script>")
    expect(errors["markup"].remote_backtrace.size).to eq(21) # 20 frames and "… 30 more frames"
    expect(errors["markup"].remote_backtrace.last).to eq("… 30 more frames")
    expect(errors["odd types"].remote_class).to be_nil
    expect(errors["odd types"].message).to match(/without a readable x-acemq-error/)
    expect(errors["odd types"].remote_backtrace).to eq(["one.rb:1"])
    expect([errors["not a table"].remote_class, errors["not a table"].remote_backtrace]).to eq([nil, []])
    expect(errors["huge"].remote_class.bytesize).to be <= 255
    expect(errors["huge"].message.bytesize).to be <= 4096
    expect(errors["none"].message).to match(/without a readable x-acemq-error/)
    errors.each_value do |e|
      expect(e.message.encoding).to eq(Encoding::UTF_8)
      expect(e.message).to be_valid_encoding
    end
  end
end
