# frozen_string_literal: true

RSpec.describe "amqp:// transport on RabbitMQ" do
  let(:url) { AMQP_URL }

  it_behaves_like "a transport"

  it "refuses a wrong password with AuthenticationFailed" do
    bad = AMQP_URL.sub(%r{//([^:]+):[^@]*@}, '//\1:wrong-password@')
    expect { AceMQ::AMQP::Connection.open(bad) }
      .to raise_error(AceMQ::AMQP::AuthenticationFailed, /refused the login/) { |e| expect(e.reply_code).to eq(403) }
  end

  it "raises PublishNacked when the broker refuses to store a message" do
    mq = AceMQ::AMQP::Connection.open(url)
    full = unique("full")
    AceMQ::AMQP::Topology.new.queue(full, arguments: { "x-max-length" => 0, "x-overflow" => "reject-publish" }).apply(mq)
    expect { mq.publish({ "x" => 1 }, to: full) }.to raise_error(AceMQ::AMQP::PublishNacked, /not stored/)
    ok = unique("ok")
    AceMQ::AMQP::Topology.new.queue(ok).apply(mq)
    expect(mq.publish({ "x" => 2 }, to: ok).id).to be_a(String) # the connection keeps working
    mq.close
  end

  it "keeps several connections and consumers apart in one process and closes them cleanly" do
    a = AceMQ::AMQP::Connection.open(url)
    b = AceMQ::AMQP::Connection.open(url)
    qa = unique("a")
    qb = unique("b")
    AceMQ::AMQP::Topology.new.queue(qa).queue(qb).apply(a)
    got = Queue.new
    subs = [a.consume(qa) { |m| got << [:a, m.payload]; AceMQ::AMQP::Ack.accept },
            b.consume(qb) { |m| got << [:b, m.payload]; AceMQ::AMQP::Ack.accept }]
    b.publish({ "to" => "a" }, to: qa)
    a.publish({ "to" => "b" }, to: qb)
    results = Array.new(2) { eventually { got.pop(true) rescue nil } }
    expect(results).to contain_exactly([:a, { "to" => "a" }], [:b, { "to" => "b" }])
    subs.each(&:cancel)
    [a, b].each(&:close)
    expect(a).to be_closed
    expect { a.publish({}, to: qa) }.to raise_error(AceMQ::AMQP::ConnectionClosed)
  end
end
