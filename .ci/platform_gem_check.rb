# frozen_string_literal: true

# One Ruby's check of the platform gem, where nothing could compile it
# (.ci/platform-gem runs it on the host with a stripped PATH and in the
# sid-bare chroot):
#
#   ruby .ci/platform_gem_check.rb GEM WORKDIR [--installed]
#
# It fails unless no compiler, cargo or rustc is on PATH (with --installed:
# none is installed either, nor libclang or this Ruby's headers); then
# installs GEM into WORKDIR/home, loads it from outside the checkout, checks
# that the extension loaded is the gem's own build for this Ruby, publishes
# and consumes on memory:// and on RabbitMQ (AMQP_URL), and runs bin/demo
# from the installed gem on both. ACEMQ_DEMO_RUN names what the demo
# declares on the broker, for the caller to delete.
require "fileutils"
require "open3"
require "rbconfig"

gem_file, workdir, flag = ARGV
abort "usage: ruby .ci/platform_gem_check.rb GEM WORKDIR [--installed]" unless gem_file && workdir
gem_file = File.expand_path(gem_file)
installed_check = flag == "--installed"
amqp_url = ENV.fetch("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
run = ENV.fetch("ACEMQ_DEMO_RUN")
ruby = "Ruby #{RUBY_VERSION}"

def fail!(message)
  abort "platform_gem_check: FAILED: #{message}"
end

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
                "/usr/lib/x86_64-linux-gnu/libclang*", "#{Dir.home}/.cargo/bin/*", "#{Dir.home}/.rustup/toolchains/*"]
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
env = { "GEM_HOME" => home, "GEM_PATH" => nil, "RUBYLIB" => nil, "RUBYOPT" => nil, "ACEMQ_DEMO_RUN" => run }

# -- Load, publish, consume -----------------------------------------------------
round_trip = <<~'RUBY'
  require "acemq/amqp"
  spec = Gem.loaded_specs.fetch("acemq")
  so = $LOADED_FEATURES.grep(%r{/acemq\.so\z}).first
  want = File.join(spec.full_gem_path, "lib/acemq/#{RbConfig::CONFIG['ruby_version']}/acemq.so")
  abort "acemq #{spec.platform} loaded #{so.inspect}, not #{want}" unless spec.platform.to_s == "x86_64-linux" && so == want

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
