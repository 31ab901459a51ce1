# frozen_string_literal: true

# Connection.open's tls: is checked before anything is dialled; the
# handshakes themselves are in spec/integration/tls_spec.rb.
RSpec.describe "Connection.open(tls:)" do
  def open(url, tls) = AceMQ::AMQP::Connection.open(url, tls: tls)

  it "refuses a key it does not know, naming the ones it does" do
    expect { open("amqps://localhost:1", { ca: "ca.pem" }) }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /unknown tls: :ca: use ca_file, cert_file, key_file, verify, server_name/)
  end

  it "wants a Hash, and a verify: that is true or false" do
    expect { open("amqps://localhost:1", true) }.to raise_error(AceMQ::AMQP::ConfigurationError, /tls: must be a Hash/)
    expect { open("amqps://localhost:1", { verify: "no" }) }
      .to raise_error(AceMQ::AMQP::ConfigurationError, /verify: \} must be true or false/)
  end

  it "takes String keys and Pathnames, as a YAML file and Rails.root give them" do
    require "pathname"
    expect { open("amqps://localhost:1", { "ca_file" => Pathname("/nonexistent/ca.pem") }) }
      .to raise_error(AceMQ::AMQP::ConfigurationError, %r{cannot read the CA file /nonexistent/ca.pem})
  end

  it "leaves memory:// alone, so a test environment may keep the production tls: setting" do
    mq = open(memory_url, { ca_file: "/nonexistent/ca.pem" })
    expect(mq).not_to be_closed
    mq.close
  end
end
