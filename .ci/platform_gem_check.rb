# frozen_string_literal: true

# One Ruby's check of the platform gem, where nothing could compile it
# (.ci/platform-gem runs it on the host with a stripped PATH and in the
# sid-bare chroot):
#
#   ruby .ci/platform_gem_check.rb GEM WORKDIR [--installed] [--no-demo] [--add-with=RUBY]
#
# It fails unless no compiler, cargo or rustc is on PATH (with --installed:
# none is installed either, nor libclang or this Ruby's headers), and unless
# GEM's platform is this machine's (x86_64-linux, or aarch64-linux in the
# arm64 chroot under qemu); then installs GEM into WORKDIR/home, loads it
# from outside the checkout, checks that the extension loaded is the gem's
# own build for this Ruby, publishes and consumes on memory:// and on
# RabbitMQ (AMQP_URL), runs the idempotent consumer on SQLite (path:) and
# the outbox relay (its row added with the sqlite3 gem) on RabbitMQ, and
# runs bin/demo from the installed gem on both transports.
# --no-demo leaves bin/demo out (under emulation, for time); --add-with=RUBY
# adds the relay's row with another Ruby of the machine and the same
# installed gem, for a Ruby Debian builds no sqlite3 gem for (3.4 on arm64).
# ACEMQ_DEMO_RUN names what the checks declare on the broker, for the caller
# to delete.
require "fileutils"
require "open3"
require "rbconfig"

gem_file, workdir, *flags = ARGV
usage = "usage: ruby .ci/platform_gem_check.rb GEM WORKDIR [--installed] [--no-demo] [--add-with=RUBY]"
add_with = flags.find { |f| f.start_with?("--add-with=") }&.delete_prefix("--add-with=")
abort usage unless gem_file && workdir && (flags - %w[--installed --no-demo] - ["--add-with=#{add_with}"]).empty?
gem_file = File.expand_path(gem_file)
installed_check = flags.include?("--installed")
amqp_url = ENV.fetch("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
run = ENV.fetch("ACEMQ_DEMO_RUN")
ruby = "Ruby #{RUBY_VERSION}"

def fail!(message)
  abort "platform_gem_check: FAILED: #{message}"
end

# -- This machine's gem ----------------------------------------------------------
platform = File.basename(gem_file)[/-(x86_64-linux|aarch64-linux)\.gem\z/, 1]
fail!("#{File.basename(gem_file)}: not a Linux platform gem") unless platform
machine = "#{RbConfig::CONFIG['host_cpu']}-linux"
fail!("#{ruby}: #{File.basename(gem_file)} is for #{platform}, this is #{machine}") unless platform == machine

# -- Nothing that compiles ----------------------------------------------------
# A check that passes on a machine with a toolchain proves nothing, so a
# toolchain found here fails the run rather than being worked around.
tools = %w[cc gcc c++ g++ clang ld cargo rustc rustup]
on_path = tools.filter_map do |tool|
  ENV.fetch("PATH").split(File::PATH_SEPARATOR).map { |dir| File.join(dir, tool) }.find { |f| File.executable?(f) }
end
fail!("#{ruby}: found on PATH: #{on_path.join(', ')}") unless on_path.empty?
if installed_check
  present = Dir["/usr/bin/{cc,gcc,gcc-*,c++,g++,clang,clang-*,cargo,rustc}", "/usr/lib/llvm-*/lib/libclang*",
                "/usr/lib/*-linux-gnu/libclang*", "#{Dir.home}/.cargo/bin/*", "#{Dir.home}/.rustup/toolchains/*"]
  header = File.join(RbConfig::CONFIG["rubyhdrdir"], "ruby.h")
  present << header if File.exist?(header)
  fail!("#{ruby}: installed here: #{present.join(', ')}") unless present.empty?
end
puts "platform_gem_check: #{ruby}: no compiler, cargo, rustc#{', libclang or ruby.h installed' if installed_check} (PATH=#{ENV['PATH']})"

# -- Install ------------------------------------------------------------------
home = File.join(workdir, "home")
FileUtils.rm_rf(home)
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
out, status = Open3.capture2e(RbConfig.ruby, "-S", "gem", "install", "--local", "--no-document", "--install-dir", home, gem_file)
seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
fail!("#{ruby}: gem install:\n#{out}") unless status.success?
puts format("platform_gem_check: %s: gem install %s: %.2f s", ruby, File.basename(gem_file), seconds)

# The child Rubies see the gem through GEM_HOME alone (GEM_PATH unset keeps
# the system's gems, which bin/demo's sqlite3 is), run outside the checkout,
# and get no RUBYLIB or RUBYOPT that could put the checkout's lib/ first.
env = { "GEM_HOME" => home, "GEM_PATH" => nil, "RUBYLIB" => nil, "RUBYOPT" => nil, "ACEMQ_DEMO_RUN" => run,
        "ACEMQ_PLATFORM" => platform }

# -- Load, publish, consume -----------------------------------------------------
round_trip = <<~'RUBY'
  require "acemq/amqp"
  spec = Gem.loaded_specs.fetch("acemq")
  so = $LOADED_FEATURES.grep(%r{/acemq\.so\z}).first
  want = File.join(spec.full_gem_path, "lib/acemq/#{RbConfig::CONFIG['ruby_version']}/acemq.so")
  platform = ENV.fetch("ACEMQ_PLATFORM")
  abort "acemq #{spec.platform} loaded #{so.inspect}, not #{platform}'s #{want}" unless spec.platform.to_s == platform && so == want

  { "memory://check" => "memory", ENV.fetch("AMQP_URL") => "RabbitMQ" }.each do |url, name|
    mq = AceMQ::AMQP::Connection.open(url)
    queue = "platform-gem-#{ENV.fetch('ACEMQ_DEMO_RUN')}"
    # x-expires: RabbitMQ deletes the queue a minute after its last use even
    # if the caller's cleanup never runs (its .dlq and .retry rungs are left
    # to that cleanup, which matches them by ACEMQ_DEMO_RUN).
    AceMQ::AMQP::Topology.new.queue(queue, arguments: { "x-expires" => 60_000 }).apply(mq)
    received = Queue.new
    subscription = mq.consume(queue) { |m| received << m.payload; AceMQ::AMQP::Ack.accept }
    mq.publish({ "ruby" => RUBY_VERSION }, to: queue)
    got = Thread.new { received.pop }.join(10)&.value
    subscription.cancel
    mq.close
    abort "#{name}: published #{RUBY_VERSION}, consumed #{got.inspect}" unless got == { "ruby" => RUBY_VERSION }
    puts "#{name}: published and consumed"
  end
  puts "loaded #{so.delete_prefix(spec.full_gem_path + '/')} from acemq-#{spec.version}-#{spec.platform}"
RUBY
out, status = Open3.capture2e(env.merge("AMQP_URL" => amqp_url), RbConfig.ruby, "-e", round_trip, chdir: workdir)
fail!("#{ruby}: load, publish, consume:\n#{out}") unless status.success?
out.each_line { |line| puts "platform_gem_check: #{ruby}: #{line}" }

# -- The idempotent consumer on SQLite, and the outbox relay ---------------------
# On RabbitMQ, with the library's own SQLite (the system libsqlite3 the
# extension links to): a duplicate is handled once; a row committed with
# the work reaches the queue through the relay.
stores = <<~'RUBY'
  require "acemq/amqp/patterns"
  include AceMQ::AMQP
  mq = Connection.open(ENV.fetch("AMQP_URL"))
  queue = "platform-gem-stores-#{ENV.fetch('ACEMQ_DEMO_RUN')}"
  Topology.new.queue(queue, arguments: { "x-expires" => 60_000 }).apply(mq)
  db = File.join(Dir.pwd, "stores-#{ENV.fetch('ACEMQ_DEMO_RUN')}.db")
  File.delete(db) if File.exist?(db)

  store = Patterns::SQLIdempotencyStore.new(path: db)
  store.create_schema
  handled = Queue.new
  subscription = mq.consume(queue, &Patterns.idempotent(store, key: ->(m) { m.payload["n"].to_s }) { |m| handled << m.payload["n"]; Ack.accept })
  [1, 1, 2].each { |n| mq.publish({ "n" => n }, to: queue) }
  got = 2.times.map { Thread.new { handled.pop }.join(10)&.value }
  sleep 0.5 # a second 1 would be handled by now
  subscription.cancel
  abort "idempotent on SQLite: handled #{got.inspect} and #{handled.size} more, want [1, 2] once each" unless got.sort == [1, 2] && handled.empty?
  abort "idempotent on SQLite: key 1 not confirmed" unless store.confirmed?("1")
  puts "idempotent consumer on SQLite: 3 published, 2 handled, the duplicate skipped"

  # The row is added in a transaction on the sqlite3 gem's connection, by
  # this Ruby or (ACEMQ_OUTBOX_ADD_WITH) another one in this chroot using the
  # same installed gem, for a Ruby Debian builds no sqlite3 gem for; the
  # relay, on its own path: connection, is this Ruby's.
  relay_store = Patterns::SQLOutboxStore.new(path: db)
  relay_store.create_schema
  add = <<~'ADD'
    require "acemq/amqp/patterns"
    require "sqlite3"
    app = SQLite3::Database.new(ARGV[0])
    outbox = AceMQ::AMQP::Patterns::SQLOutboxStore.new(connection: app)
    mq = AceMQ::AMQP::Connection.open("memory://")
    record = AceMQ::AMQP::Patterns.record(mq, { "order" => "A-1", "by" => RUBY_VERSION }, to: ARGV[1])
    app.transaction { outbox.add(record, connection: app) }
  ADD
  adder = ENV["ACEMQ_OUTBOX_ADD_WITH"] || RbConfig.ruby
  system(adder, "-e", add, db, queue, exception: true)
  relayed = Queue.new
  subscription = mq.consume(queue) { |m| relayed << m.payload; Ack.accept }
  relay = Patterns::OutboxRelay.new(mq, relay_store, interval: 0.2)
  relay.start
  got = Thread.new { relayed.pop }.join(10)&.value
  relay.close
  subscription.cancel
  abort "outbox relay: consumed #{got.inspect}" unless got&.fetch("order", nil) == "A-1"
  abort "outbox relay: #{relay_store.backlog.inspect} left" unless relay_store.backlog.count.zero?
  puts "outbox relay: a row committed by Ruby #{got['by']} relayed by #{RUBY_VERSION} and consumed, backlog 0"
  mq.close
RUBY
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
stores_env = env.merge("AMQP_URL" => amqp_url, "ACEMQ_OUTBOX_ADD_WITH" => add_with)
out, status = Open3.capture2e(stores_env, RbConfig.ruby, "-e", stores, chdir: workdir)
fail!("#{ruby}: stores:\n#{out}") unless status.success?
out.each_line { |line| puts "platform_gem_check: #{ruby}: #{line}" }
puts format("platform_gem_check: %s: stores checked in %.1f s", ruby, Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0)
exit if flags.include?("--no-demo")

# -- bin/demo -------------------------------------------------------------------
# Copied out of the checkout: its `$LOAD_PATH.unshift("../lib")` then names a
# directory that does not exist, and acemq comes from the installed gem.
demo = File.join(workdir, "demo", "bin", "demo")
FileUtils.mkdir_p(File.dirname(demo))
FileUtils.cp(File.expand_path("../bin/demo", __dir__), demo)
# ACEMQ_DEMO_RUBYLIB: where the caller put a sqlite3 gem for a Ruby that
# Debian builds none for (.ci/sqlite3-for-ruby34), for the demo alone.
demo_env = env.merge("RUBYLIB" => ENV["ACEMQ_DEMO_RUBYLIB"])
sqlite3 = system(demo_env, RbConfig.ruby, "-e", "require 'sqlite3'", err: File::NULL)
fail!("#{ruby}: no sqlite3 gem to run bin/demo with (its steps 3 to 6 are SQLite; see ACEMQ_DEMO_RUBYLIB)") unless sqlite3
{ "memory://" => nil, "RabbitMQ" => amqp_url }.each do |name, url|
  out, status = Open3.capture2e(demo_env.merge("AMQP_URL" => url), RbConfig.ruby, demo, chdir: workdir)
  # The demo's last step, as its spec (spec/integration/demo_spec.rb) checks it.
  fail!("#{ruby}: bin/demo on #{name}:\n#{out}") unless status.success? && out.include?("payments rows for A-5: 1")
  puts "platform_gem_check: #{ruby}: bin/demo on #{name}: ok"
end
