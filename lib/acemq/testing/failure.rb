# frozen_string_literal: true

module AceMQ
  module Testing
    # A failed assertion when no framework has said what one is (a Harness
    # started by hand). The kits pass their own: RSpec's
    # ExpectationNotMetError, Minitest::Assertion.
    class Failure < StandardError; end
  end
end
