# frozen_string_literal: true

require_relative "lib/acemq/version"

Gem::Specification.new do |s|
  s.name = "acemq"
  s.version = AceMQ::VERSION
  s.summary = "RabbitMQ for Ruby and Rails where at-least-once is made harmless"
  s.description = "Publish with confirms, consume with Ack, a retry ladder and a dead-letter queue that keeps " \
                  "every failure and its reason, the idempotent consumer and the transactional outbox. " \
                  "The engine is a Rust crate (lapin, tokio) shared with Rust services."
  s.authors = ["AceMQ"]
  s.license = "MIT"
  s.required_ruby_version = ">= 3.1"
  s.files = Dir["lib/**/*.rb", "lib/**/*.erb", "lib/**/*.rake", "lib/generators/**/*.tt", "exe/*", "ext/extconf.rb", "ext/Cargo.toml", "ext/src/**/*.rs", "core/Cargo.toml",
                "core/src/**/*.rs", "vendor/lapin/**/*", "Cargo.toml", "Cargo.lock", "README.md", "docs/**/*.md"]
            .select { |f| File.file?(f) } # vendor/lapin/**/* names its directories too
  s.extensions = ["ext/extconf.rb"]
  s.require_paths = ["lib"]
  s.bindir = "exe"
  s.executables = ["acemq"]
  # No runtime dependencies: database drivers are recognised by the methods
  # they answer, never required.
end
