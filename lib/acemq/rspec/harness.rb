# frozen_string_literal: true

require "rspec/expectations"
require "acemq/testing/harness"

module AceMQ
  module RSpec
    # The shared Harness (AceMQ::Testing::Harness) started around RSpec
    # examples, failing them with RSpec's ExpectationNotMetError.
    module Harness
      FAILURE = ::RSpec::Expectations::ExpectationNotMetError

      class << self
        def start = Testing::Harness.start(failure: FAILURE)
        def stop = Testing::Harness.stop
        def current = Testing::Harness.current
        def current! = Testing::Harness.current!

        # The kit in RSpec's configuration: helpers and matchers in the
        # example groups matching filters (all of them by default), and a
        # harness for each of their examples but those tagged acemq: false.
        def install_into(config, **filters)
          config.include Helpers, **filters
          config.include Matchers, **filters
          # Config hooks are the outermost: the example's own before hooks
          # already publish to the example's broker, and its after hooks can
          # still look at what was published before the broker is reset.
          config.before(**filters) { |example| Harness.start unless example.metadata[:acemq] == false }
          config.after(**filters) { Harness.stop }
        end
      end
    end

    # The mechanism's classes under the names this kit gave them first.
    Outcome = Testing::Outcome
    Published = Testing::Published
    RecordingPublisher = Testing::RecordingPublisher
    RecordingBatch = Testing::RecordingBatch
    ConsumerRun = Testing::ConsumerRun
  end
end
