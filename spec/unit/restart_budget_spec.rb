# frozen_string_literal: true

# Core's restart rule and control check as the --processes parent reads
# them (issue 50 part 2: one of each mechanism, the runner's and the
# parent's).
RSpec.describe AceMQ::AMQP::RestartBudget do
  it "answers core's doubling pauses, then nil once max_restarts are spent within the window" do
    budget = described_class.new(max_restarts: 3, window: 60)
    expect(Array.new(4) { budget.spend }).to eq([1.0, 2.0, 4.0, nil])
    expect([budget.recent, budget.total]).to eq([3, 3])
    expect(budget.inspect).to include("3/3 within 60.0s")
  end

  it "takes core's defaults for what is nil" do
    defaults = AceMQ::AMQP::NativeSupervisor::RESTART_DEFAULTS
    budget = described_class.new
    expect([budget.max_restarts, budget.window]).to eq([defaults[:max_restarts], defaults[:window]])
    pauses = Array.new(defaults[:max_restarts] + 1) { budget.spend }
    expect(pauses.last).to be_nil
    expect(pauses.compact).to eq(Array.new(defaults[:max_restarts]) { |i| [defaults[:initial_backoff] * 2**i, defaults[:max_backoff]].min })
  end

  it "refuses what is not a count or a number of seconds, naming the setting (never 1.5 read as 1)" do
    [-1, 2**32, 2**70, 1.5, 0.5, Float::INFINITY, Float::NAN, "5", Rational(1, 3)].each do |bad|
      expect { described_class.new(max_restarts: bad) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /\Amax_restarts must be a whole number from 0 to 4294967295 \(got /)
    end
    [-5, 2**64, Float::INFINITY, Float::NAN].each do |bad|
      expect { described_class.new(window: bad) }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /\Arestart_window must be a number of seconds: zero or more, and below 2\*\*64/)
    end
    expect { described_class.new(window: "soon") }.to raise_error(AceMQ::AMQP::ConfigurationError, /restart_window must be a number of seconds \(got "soon"\)/)
    expect(described_class.new(max_restarts: 0).spend).to be_nil
  end
end

RSpec.describe "AceMQ::AMQP::NativeSupervisor.authorize_control" do
  let(:check) { AceMQ::AMQP::NativeSupervisor.method(:authorize_control) }

  it "takes any request from loopback without a token, and none from elsewhere" do
    expect(check.call(nil, "POST /x HTTP/1.1\r\n\r\n", true)).to be_nil
    expect(check.call("", "POST /x HTTP/1.1\r\n\r\n", true)).to be_nil
    expect(check.call(nil, "POST /x HTTP/1.1\r\n\r\n", false)).to include("127.0.0.1 only")
  end

  it "reads the scheme in any case, and a configured token without the line break a secret file ends in" do
    head = "POST /x HTTP/1.1\r\nauthorization: bearer s3cret\r\n\r\n"
    expect(check.call("s3cret\n", head, false)).to be_nil
    expect(check.call(" \n", "POST /x HTTP/1.1\r\n\r\n", true)).to be_nil # blank: no token
  end

  it "takes only the bearer token once one is set, from loopback too" do
    head = ->(auth) { "POST /x HTTP/1.1\r\nHost: h\r\n#{auth}\r\n\r\n" }
    expect(check.call("s3cret", head.call("authorization: Bearer s3cret"), false)).to be_nil
    expect(check.call("s3cret", head.call("Authorization: Bearer s3cre"), true)).to include("control token")
    expect(check.call("s3cret", head.call("Authorization: Basic s3cret"), true)).to include("control token")
    expect(check.call("s3cret", head.call("X: y"), true)).to include("control token")
  end
end
