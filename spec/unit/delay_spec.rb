# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "sqlite3"
require "acemq/status"
require "acemq/web"
require "rack/mock"

# Delayed publish on memory://, on its clock: half an hour passes in an
# advance_clock, and the message arrives once due, with its envelope.
RSpec.describe "delayed publish on memory://" do
  let(:mq) { AceMQ::AMQP::Connection.open("memory://#{unique('delay')}") }
  let(:queue) { unique("charges") }
  let(:got) { Queue.new }

  before do
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    @sub = mq.consume(queue) { |m| got << m; AceMQ::AMQP::Ack.accept }
  end

  after do
    @sub.cancel
    mq.close
  end

  def nothing_yet
    sleep 0.05
    expect(got).to be_empty
  end

  it "holds a 30-minute delay until the clock passes it, and counts it in its level meanwhile" do
    env = mq.publish({ "order_id" => "A-1" }, to: queue, delay: 30 * 60)
    nothing_yet
    # 1800 s = 1024 + 512 + 256 + 8: on RabbitMQ it waits in level 10 first.
    expect(mq.delayed.map(&:to_h)).to eq([{ level: 10, queue: "acemq.delay.10", seconds: 1024, waiting: 1 }])
    report = AceMQ::Status.render(AceMQ::Status.new(connection: mq, targets: [], interval: 0).collect)
    expect(report).to include("delayed: 1 waiting (1024s: 1)")
    # The dashboard's overview says the same, and refreshes it.
    web = Rack::MockRequest.new(AceMQ::Web.new(connection: mq, queues: [queue], runners: []))
    expect(web.get("/").body).to include(%(<p data-k="delayed" id="delayed">1 waiting (1024s: 1)</p>))
    expect(JSON.parse(web.get("/overview.json").body)["values"]).to include("delayed" => "1 waiting (1024s: 1)")
    mq.advance_clock(29 * 60)
    nothing_yet
    expect(mq.delayed.map(&:level)).to eq([5]) # 60 s left
    mq.advance_clock(60)
    message = eventually { got.pop(true) rescue nil }
    expect(message.envelope.id).to eq(env.id)
    expect(mq.delayed).to eq([])
  end

  it "delays a batch, an outbox row and at: alike, and refuses a delay to a queue that does not exist" do
    expect { mq.publish({}, to: unique("missing"), delay: 5) }.to raise_error(AceMQ::AMQP::Unroutable)
    mq.batch { |b| b.publish({ "n" => "held" }, to: queue, delay: 5) }
    mq.batch(stream: true) { |b| b.publish({ "n" => "streamed" }, to: queue, delay: 5) }
    mq.publish({ "n" => "at" }, to: queue, at: Time.now + 5)
    db = SQLite3::Database.new(":memory:")
    store = AceMQ::AMQP::Patterns::SQLOutboxStore.new(connection: db)
    store.create_schema
    store.add(AceMQ::AMQP::Patterns.record(mq, { "n" => "outbox" }, to: queue, delay: 5), connection: db)
    AceMQ::AMQP::Patterns::OutboxRelay.new(mq, store).sweep
    mq.publish({ "n" => "now" }, to: queue)
    expect(eventually { got.pop(true) rescue nil }.payload["n"]).to eq("now")
    nothing_yet
    expect(mq.delayed.sum(&:waiting)).to eq(4)
    mq.advance_clock(5)
    expect(Array.new(4) { eventually { got.pop(true) rescue nil }.payload["n"] })
      .to contain_exactly("held", "streamed", "at", "outbox")
  end

  it "does not delay again a delivered message that is forwarded with its envelope" do
    mq.publish({ "n" => 1 }, to: queue, delay: 2)
    mq.advance_clock(2)
    first = eventually { got.pop(true) rescue nil }
    mq.publish(first.payload, to: queue, envelope: first.envelope)
    expect(eventually { got.pop(true) rescue nil }.envelope.id).to eq(first.envelope.id)
  end
end
