# frozen_string_literal: true

require "open3"
require "tmpdir"
require "rbconfig"

# Every fenced Ruby block in README.md and docs/ runs as printed, so a page
# cannot rot. A block is run as a script of its own, with this checkout's lib
# on the load path and spec/docs/elided.rb (the application the samples
# leave out) loaded first. A block that names a broker URL runs twice: on
# RabbitMQ, in a vhost of its own so samples cannot see each other's
# messages, and on memory://.
#
# An HTML comment on the line before a fence says more (docs/testing.md,
# "The samples on these pages"):
#   <!-- sample: setup -->       run before every later block of the page
#   <!-- sample: name=step1 -->  name the block
#   <!-- sample: after=step1 --> run the named block (and its own after=) first
#   <!-- sample: rails -->       run inside spec/dummy's Rails application
#   <!-- sample: raises -->      its handlers raise on purpose
#   <!-- sample: skip REASON --> not run, and why
module DocsSamples
  ROOT = File.expand_path("../..", __dir__)
  PAGES = ["README.md", *Dir[File.join(ROOT, "docs", "*.md")].map { |f| f.delete_prefix("#{ROOT}/") }.sort].freeze
  BROKER = "amqp://guest:guest@localhost:5672"

  Block = Struct.new(:page, :line, :code, :directives, :name, keyword_init: true) do
    def label = "#{page}:#{line}"
    def skip = directives[:skip]
    def broker? = code.include?("amqp://")
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
    %w[setup rails raises].each { |flag| d[flag.to_sym] = true if text.split.include?(flag) }
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
    prefix = block.directives[:rails] ? [%(require #{File.join(ROOT, 'spec/dummy/config/environment').inspect}\n)] : []
    (prefix + setup + chain + [block.code]).uniq.join("\n")
  end
end

RSpec.describe "the samples in README.md and docs/" do
  def run_sample(code, env: {}, dir:)
    file = File.join(dir, "sample.rb")
    File.write(file, code)
    Open3.capture3(env, "timeout", "60", RbConfig.ruby, "-I", File.join(DocsSamples::ROOT, "lib"),
                   "-r", File.join(DocsSamples::ROOT, "spec/docs/elided.rb"), file, chdir: dir)
  end

  def with_vhost
    vhost = "acemq-docs-#{SecureRandom.hex(4)}"
    system("rabbitmqctl", "add_vhost", vhost, out: File::NULL, err: File::NULL) or raise "cannot add vhost #{vhost}"
    system("rabbitmqctl", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*", out: File::NULL, err: File::NULL)
    yield vhost
  ensure
    system("rabbitmqctl", "delete_vhost", vhost, out: File::NULL, err: File::NULL) if vhost
  end

  DocsSamples::PAGES.each do |page|
    blocks = DocsSamples.blocks(page)
    describe page do
      blocks.each do |block|
        next it("#{block.label} (skipped: #{block.skip})") { skip(block.skip) } if block.skip

        transports = block.broker? ? %i[rabbitmq memory] : [:as_printed]
        transports.each do |transport|
          it "#{block.label} runs as printed#{transport == :as_printed ? '' : " on #{transport}"}" do
            code = DocsSamples.script(block, blocks)
            env = block.directives[:raises] ? { "DOCS_SAMPLE_RAISES" => "1" } : {}
            Dir.mktmpdir("acemq-docs") do |dir|
              out, err, status = if transport == :rabbitmq
                                   with_vhost do |vhost|
                                     run_sample(code.gsub(%r{(amqp://[^"'\s]*?localhost:5672)(/)?(?=["'\s])}) { "#{Regexp.last_match(1)}/#{vhost}" },
                                                env: env, dir: dir)
                                   end
                                 elsif transport == :memory
                                   run_sample(code.gsub(%r{amqp://[^"'\s]*?localhost:5672[^"'\s]*}) { "memory://docs-#{SecureRandom.hex(3)}" },
                                              env: env, dir: dir)
                                 else
                                   run_sample(code, env: env, dir: dir)
                                 end
              expect(status.exitstatus).to eq(0), "#{block.label} exited #{status.exitstatus}:\n#{err}\n#{out}"
              expect(err).not_to include("docs-sample: handler raised"), "#{block.label}: #{err}"
            end
          end
        end
      end
    end
  end
end
