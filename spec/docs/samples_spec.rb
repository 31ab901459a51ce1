# frozen_string_literal: true

require "open3"
require "tmpdir"
require "rbconfig"

# Every fenced Ruby block in README.md and docs/ runs as printed, so a page
# cannot rot. A block is run as a script of its own, with this checkout's lib
# on the load path and spec/docs/elided.rb (the application the samples
# leave out) loaded first; a script with an RSpec.describe in it is run by
# rspec, and must run an example and fail none. A script that names a broker
# URL (its own, or its page setup's) runs twice: on RabbitMQ, in a vhost of
# its own so samples cannot see each other's messages, and on memory://.
#
# An HTML comment on the line before a fence says more (docs/testing.md,
# "The samples on these pages"):
#   <!-- sample: setup -->       run before every later block of the page
#   <!-- sample: name=step1 -->  name the block
#   <!-- sample: after=step1 --> run the named block (and its own after=) first
#   <!-- sample: rails -->       run inside spec/dummy's Rails application
#   <!-- sample: raises -->      its handlers raise on purpose
#   <!-- sample: rabbitmq -->    on RabbitMQ only: what it shows memory:// has not (several nodes)
#   <!-- sample: skip REASON --> not run, and why
module DocsSamples
  ROOT = File.expand_path("../..", __dir__)
  PAGES = ["README.md", *Dir[File.join(ROOT, "docs", "*.md")].map { |f| f.delete_prefix("#{ROOT}/") }.sort].freeze
  # The broker the samples' printed URL is pointed at: the shared one, or a
  # newer-stack stage's own (.ci/stage-sid sets ACEMQ_SAMPLES_BROKER).
  BROKER = ENV.fetch("ACEMQ_SAMPLES_BROKER", "amqp://guest:guest@localhost:5672")
  # The broker URLs the pages print: RabbitMQ on this machine, by either
  # name, with or without a trailing slash or a vhost.
  BROKER_URL = %r{amqp://[^"'\s/]*?(?:localhost|127\.0\.0\.1):5672(?:/[^"'\s]*)?}
  RSPEC = Gem.bin_path("rspec-core", "rspec")
  DUMMY = File.join(ROOT, "spec", "dummy")
  # Nothing of the suite's own choice of broker or database reaches a
  # sample: what it runs on is what it prints.
  ENV_BASE = { "AMQP_URL" => nil, "DATABASE_URL" => ENV.fetch("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
               "SPEC_OPTS" => nil, "RAILS_ENV" => nil, "ACEMQ_DUMMY_SQLITE" => nil, "ACEMQ_DUMMY_SCHEMA" => nil,
               "DOCS_SAMPLE_RAILS" => nil, "DOCS_SAMPLE_RAISES" => nil }.freeze

  Block = Struct.new(:page, :line, :code, :directives, :name, keyword_init: true) do
    def label = "#{page}:#{line}"
    def skip = directives[:skip]
  end

  def self.blocks(page)
    lines = File.readlines(File.join(ROOT, page))
    found = []
    i = 0
    while i < lines.size
      if lines[i] =~ /\A```ruby\s*\z/
        start = i + 1
        j = start
        j += 1 until j >= lines.size || lines[j].start_with?("```")
        found << Block.new(page: page, line: start, code: lines[start...j].join, directives: directives(lines, i),
                           name: nil)
        i = j
      end
      i += 1
    end
    found.each { |b| b.name = b.directives[:name] }
    found
  end

  def self.directives(lines, fence)
    k = fence - 1
    k -= 1 while k >= 0 && lines[k].strip.empty?
    return {} unless k >= 0 && (m = lines[k].match(/<!--\s*sample:\s*(.*?)\s*-->/))

    text = m[1]
    d = {}
    d[:skip] = text.sub(/\Askip\s*/, "") if text.start_with?("skip")
    text.scan(/(\w+)=(\S+)/) { |key, value| d[key.to_sym] = value }
    %w[setup rails raises rabbitmq].each { |flag| d[flag.to_sym] = true if text.split.include?(flag) }
    d
  end

  # The script for block: the page's setup blocks before it, then its
  # after= chain, then itself.
  def self.script(block, page_blocks)
    before = page_blocks.take_while { |b| !b.equal?(block) }
    setup = before.select { |b| b.directives[:setup] }.map(&:code)
    chain = []
    name = block.directives[:after]
    while name
      dep = before.find { |b| b.name == name } or raise "#{block.label}: after=#{name} names no earlier block"
      chain.unshift(dep.code)
      name = dep.directives[:after]
    end
    prefix = block.directives[:rails] ? [RAILS_PREFIX] : []
    (prefix + setup + chain + [block.code]).uniq.join("\n")
  end

  # A rails block runs in spec/dummy's application, booted in the test
  # environment on a SQLite file of the run's own, migrated first (the app
  # has no schema.rb; its specs migrate the same way). The migrations are
  # named by Rails.root: the script runs in a directory of its own.
  RAILS_PREFIX = <<~RUBY
    require #{File.join(DUMMY, 'config/environment').inspect}
    ActiveRecord::Migration.verbose = false
    # As spec/dummy/spec/rails_helper.rb: the pool's migration_context on
    # Rails 7.2 (the SchemaMigration class is no longer one), the
    # connection's before. Both read the migrations from
    # Migrator.migrations_paths, "db/migrate" relative to the directory the
    # script runs in, which is not the app's.
    ActiveRecord::Migrator.migrations_paths = [Rails.root.join("db/migrate").to_s]
    pool = ActiveRecord::Base.connection_pool
    (pool.respond_to?(:migration_context) ? pool : ActiveRecord::Base.connection).migration_context.migrate
  RUBY

  def self.rails_env(dir)
    { "RAILS_ENV" => "test", "ACEMQ_DUMMY_SQLITE" => File.join(dir, "app.sqlite3"), "DATABASE_URL" => nil,
      "DOCS_SAMPLE_RAILS" => "1" }
  end

  # Where a block runs. One that names a broker, or uses the connection its
  # page's setup opened (mq, as every page calls it), runs on RabbitMQ and
  # on memory://; one whose script opens a connection only in the page's
  # setup, and never uses it, runs on memory:// alone (its broker makes no
  # difference to it, and a Rails boot is most of a run); the rest as printed.
  def self.transports(block, blocks, code)
    return [:as_printed] unless code.match?(BROKER_URL)
    return [:rabbitmq] if block.directives[:rabbitmq] # what it shows is the broker's (several nodes, alarms)

    own = script(block, blocks.reject { |b| b.directives[:setup] && !b.equal?(block) })
    own.match?(BROKER_URL) || own.match?(/\bmq\b/) ? %i[rabbitmq memory] : [:memory]
  end

  # The script with every broker URL it prints pointed at url instead.
  def self.on_broker(code, url) = code.gsub(BROKER_URL, url)

  # One run of a script on one transport, in a directory of its own, with
  # nothing of this process's broker or database choice: the URLs a sample
  # prints are the ones it uses (rewritten to a private vhost, or to
  # memory://), and DATABASE_URL is the suite's PostgreSQL for the samples
  # that name it. result waits for the run, and makes it now if no worker
  # has taken it.
  class Run
    attr_reader :block, :transport

    def initialize(block, code, transport)
      @block = block
      @code = code
      @transport = transport
      @rspec = code.match?(/^\s*RSpec\.describe\b/)
      @lock = Mutex.new
      @result = nil
    end

    def rspec? = @rspec

    def result = @lock.synchronize { @result ||= execute }

    # For a worker: run it unless it has been run (or is running).
    def prefetch
      return unless @lock.try_lock

      begin
        @result ||= execute
      ensure
        @lock.unlock
      end
    end

    private

    def execute
      env = {}
      env["DOCS_SAMPLE_RAISES"] = "1" if block.directives[:raises]
      Dir.mktmpdir("acemq-docs") do |dir|
        env.merge!(DocsSamples.rails_env(dir)) if block.directives[:rails]
        case transport
        when :rabbitmq
          DocsSamples.with_vhost do |vhost|
            url = "#{BROKER}/#{vhost}"
            run(DocsSamples.on_broker(@code, url), env.merge("AMQP_URL" => url), dir)
          end
        when :memory
          # One broker for the whole script: every connection a sample opens
          # to the URL it prints is a connection to the same one.
          url = "memory://docs-#{SecureRandom.hex(4)}"
          run(DocsSamples.on_broker(@code, url), env.merge("AMQP_URL" => url), dir)
        else
          run(@code, env, dir)
        end
      end
    end

    def run(code, env, dir)
      file = File.join(dir, rspec? ? "sample_spec.rb" : "sample.rb")
      File.write(file, code)
      ruby = [RbConfig.ruby, "-I", File.join(ROOT, "lib"), "-r", File.join(ROOT, "spec/docs/elided.rb")]
      cmd = rspec? ? [*ruby, RSPEC, "--no-color", "--order", "defined", file] : [*ruby, file]
      Open3.capture3(ENV_BASE.merge(env), "timeout", "60", *cmd, chdir: dir)
    end
  end

  def self.with_vhost
    vhost = "acemq-docs-#{SecureRandom.hex(4)}"
    system("rabbitmqctl", "add_vhost", vhost, out: File::NULL, err: File::NULL) or raise "cannot add vhost #{vhost}"
    system("rabbitmqctl", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*", out: File::NULL, err: File::NULL)
    yield vhost
  ensure
    system("rabbitmqctl", "delete_vhost", vhost, out: File::NULL, err: File::NULL) if vhost
  end

  # Most of a run is waiting (a broker, a Rails boot, a script's handlers
  # going quiet), so the runs of the examples about to run are made a few at
  # a time (DOCS_SAMPLES_JOBS, default 4) while the examples wait for theirs.
  def self.prefetch(runs)
    queue = Queue.new
    runs.each { |r| queue << r }
    queue.close
    Integer(ENV.fetch("DOCS_SAMPLES_JOBS", 4)).times.map do
      Thread.new do
        while (run = queue.pop)
          run.prefetch
        end
      end
    end
  end
end

RSpec.describe "the samples in README.md and docs/" do
  before(:context) do
    runs = self.class.descendant_filtered_examples.filter_map { |e| e.metadata[:docs_run] }
    @workers = DocsSamples.prefetch(runs)
  end

  after(:context) { @workers&.each(&:kill) }

  DocsSamples::PAGES.each do |page|
    blocks = DocsSamples.blocks(page)
    describe page do
      blocks.each do |block|
        next it("#{block.label} (skipped: #{block.skip})") { skip(block.skip) } if block.skip

        code = DocsSamples.script(block, blocks)
        transports = DocsSamples.transports(block, blocks, code)
        transports.each do |transport|
          run = DocsSamples::Run.new(block, code, transport)
          it "#{block.label} runs as printed#{transport == :as_printed ? '' : " on #{transport}"}", docs_run: run do
            out, err, status = run.result
            expect(status.exitstatus).to eq(0), "#{block.label} exited #{status.exitstatus}:\n#{err}\n#{out}"
            expect(err).not_to include("docs-sample: handler raised"), "#{block.label}: #{err}"
            if run.rspec?
              expect(out).to match(/^[1-9]\d* examples?, 0 failures/), "#{block.label} ran no examples:\n#{out}"
            end
          end
        end
      end
    end
  end
end
