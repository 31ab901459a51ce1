# frozen_string_literal: true

require "acemq/secure_compare"

# The one comparison of secret tokens on the Ruby side: the dashboard's CSRF
# token and the swarm's control token both call it.
RSpec.describe "AceMQ.secure_compare" do
  it "is true only for the same bytes" do
    token = "a" * 64
    expect(AceMQ.secure_compare(token.dup, token)).to be(true)
    expect(AceMQ.secure_compare("#{'a' * 63}b", token)).to be(false)
    expect(AceMQ.secure_compare("b#{'a' * 63}", token)).to be(false)
  end

  it "is false for a different length, a prefix included" do
    expect(AceMQ.secure_compare("s3cre", "s3cret")).to be(false)
    expect(AceMQ.secure_compare("s3crets", "s3cret")).to be(false)
    expect(AceMQ.secure_compare("", "s3cret")).to be(false)
    expect(AceMQ.secure_compare("", "")).to be(true)
  end

  it "compares bytes, not characters" do
    expect(AceMQ.secure_compare("é", "e\u0301")).to be(false)
    expect(AceMQ.secure_compare("é".b, "é")).to be(true)
  end
end
