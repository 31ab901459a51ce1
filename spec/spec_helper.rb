# frozen_string_literal: true

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "acemq/amqp"
require "securerandom"
Dir[File.join(__dir__, "support", "**", "*.rb")].sort.each { |f| require f }

RSpec.configure do |config|
  config.expect_with(:rspec) { |c| c.syntax = :expect }
  config.mock_with(:rspec) { |m| m.verify_partial_doubles = true }
  config.disable_monkey_patching!
  config.order = :random
  Kernel.srand config.seed
  # A focused example left in a commit would silently skip the rest under CI.
  config.filter_run_when_matching :focus unless ENV["CI"]
  config.before(:suite) do
    if ENV["CI"] && RSpec.world.filtered_examples.values.flatten.any? { |e| e.metadata[:focus] }
      abort "focused examples under CI: remove the :focus / fit / fdescribe"
    end
  end
  config.include AceMQSpecHelpers
  config.after(:suite) { AceMQSpecHelpers.delete_named_queues }
  # ACEMQ_GC_STRESS=1 runs every example under GC.stress: how a Ruby value
  # the extension forgot to mark shows up.
  if ENV["ACEMQ_GC_STRESS"]
    config.around do |ex|
      GC.stress = true
      ex.run
    ensure
      GC.stress = false
    end
  end
end
