# frozen_string_literal: true

require "spec_helper"

RSpec.describe "request/reply on memory://" do
  let(:url) { "memory://#{unique('rpc')}" }

  it_behaves_like "request/reply"
end
