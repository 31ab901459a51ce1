# frozen_string_literal: true

require "acemq"

module AceMQ
  # What the two test kits share, with neither framework in it: the
  # per-test memory:// broker and its recording publisher (Harness,
  # RecordingPublisher, Published), deliver's run of a consumer class and
  # what it reads off the broker (ConsumerRun, Outcome), the helpers
  # (Helpers) and the question "what was published?" (PublishExpectation).
  # acemq/rspec and acemq/minitest each add their framework's hooks and
  # assertion syntax, and nothing else.
  module Testing
  end
end

require "acemq/testing/failure"
require "acemq/testing/harness"
require "acemq/testing/helpers"
require "acemq/testing/publish_expectation"
