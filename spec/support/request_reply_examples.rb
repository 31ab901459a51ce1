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
    expect { mq.request({ "n" => 1 }, to: queue, timeout: 0.3) }.to raise_error(AceMQ::AMQP::TimeoutError, /no reply/)
    expect(mq.late_replies).to eq(0)
    serve { |m| mq.reply(m, { "echo" => m.payload["n"] }); AceMQ::AMQP::Ack.accept }
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
end
