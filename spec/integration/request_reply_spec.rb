# frozen_string_literal: true

require "spec_helper"

RSpec.describe "request/reply on RabbitMQ (direct reply-to)" do
  let(:url) { AMQP_URL }

  it_behaves_like "request/reply"
end
