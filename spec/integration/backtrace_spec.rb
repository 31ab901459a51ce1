# frozen_string_literal: true

require "acemq/rails"

# A handler's exception carries its first frames round the retry ladder and
# into the DLQ as x-acemq-backtrace (core bounds it: 20 frames, 4 KiB, a line
# of 512 bytes), without the gem's own frames at its bottom.
RSpec.describe "a failure's backtrace on its copy, on RabbitMQ" do
  let(:mq) { AceMQ::AMQP::Connection.open(AMQP_URL) }
  let(:queue) { unique("backtrace") }
  let(:header) { "x-acemq-backtrace" }

  before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
  after { mq.close }

  class BacktraceSpecError < StandardError; end

  # Nested calls, so the raising line is not the handler's own.
  def charge(message)
    validate(message)
  end

  def validate(_message)
    raise BacktraceSpecError, "amount missing" # RAISES HERE
  end

  def raising_line = "#{__FILE__}:#{File.readlines(__FILE__).index { |l| l.include?("# RAISES" + " HERE") } + 1}"

  def down(depth)
    raise BacktraceSpecError, "bottom" if depth.zero?

    down(depth - 1)
  end

  def dead_letters(count)
    eventually(timeout: 10) { (l = mq.peek_dead_letters(queue, limit: 10)).size >= count && l }
  end

  # What the engine keeps of `frames`: the gem's frames at the bottom left out.
  def without_gem_tail(frames)
    frames = frames.dup
    frames.pop while frames.any? && frames.last.start_with?(AceMQ::AMQP::GEM_FRAMES)
    frames
  end

  it "names the raising file:line first, then the calls from the handler, without the gem's consumer loop" do
    sub = mq.consume(queue, retries: { max_attempts: 1 }) { |m| charge(m) }
    mq.publish({ "order_id" => "B-1" }, to: queue)
    letter = dead_letters(1).first
    sub.cancel
    lines = letter.backtrace.split("\n")
    expect(letter.headers[header]).to eq(letter.backtrace)
    expect(lines[0]).to match(frame(raising_line, "validate"))
    expect(lines[1]).to match(frame(nil, "charge"))
    expect(lines.last).to start_with("#{__FILE__}:") # the handler block, the last frame kept
    expect(lines.grep(%r{lib/acemq/})).to eq([])
    expect(letter.error_class).to eq("BacktraceSpecError")
    expect(letter.reason).to include("amount missing")
  end

  it "keeps 20 frames of a deep recursion and says how many more there were" do
    raised = Queue.new
    sub = mq.consume(queue, retries: { max_attempts: 1 }) do |_m|
      down(200)
    rescue BacktraceSpecError => e
      raised << e.backtrace
      raise
    end
    mq.publish({ "deep" => true }, to: queue)
    letter = dead_letters(1).first
    sub.cancel
    frames = without_gem_tail(raised.pop)
    expect(frames.size).to be > 200
    lines = letter.backtrace.split("\n")
    expect(lines.size).to eq(21)
    expect(lines.first(20)).to eq(frames.first(20))
    expect(lines.last).to eq("… #{frames.size - 20} more frames")
    expect(letter.backtrace.bytesize).to be <= 4096
  end

  it "cuts at 4 KiB on a frame boundary when 20 frames are longer" do
    # A method named at 300 bytes: each frame names it, so 20 pass 4 KiB.
    long = "down_#{'x' * 300}"
    helper = Module.new
    helper.module_eval("def #{long}(d) = d.zero? ? raise(BacktraceSpecError, 'long') : #{long}(d - 1)", __FILE__, __LINE__)
    target = Object.new.extend(helper)
    raised = Queue.new
    sub = mq.consume(queue, retries: { max_attempts: 1 }) do |_m|
      target.send(long, 30)
    rescue BacktraceSpecError => e
      raised << e.backtrace
      raise
    end
    mq.publish({ "long" => true }, to: queue)
    letter = dead_letters(1).first
    sub.cancel
    frames = without_gem_tail(raised.pop)
    text = letter.backtrace
    lines = text.split("\n")
    shown = lines.size - 1
    expect(text.bytesize).to be <= 4096
    expect(shown).to be_between(5, 19)
    expect(lines.first(shown)).to eq(frames.first(shown)) # whole frames, none cut in the middle
    expect(lines.last).to eq("… #{frames.size - shown} more frames")
  end

  it "bounds a hostile exception, and handles the messages before and after it" do
    handled = Queue.new
    sub = mq.consume(queue, retries: { max_attempts: 1 }) do |m|
      if m.payload["hostile"]
        e = BacktraceSpecError.new("<img src=x onerror=alert(1)> \xFF\xFE".b)
        e.set_backtrace(["app/<script>alert(2)</script>.rb:1:in `x'\n\e[31m\xFF\x00".b,
                         "app/huge.rb:2:in `#{'m' * 100 * 1024}'", "app/after.rb:3:in `y'"])
        raise e
      end
      handled << m.payload["n"]
      AceMQ::AMQP::Ack.accept
    end
    mq.publish({ "n" => 1 }, to: queue)
    mq.publish({ "hostile" => true }, to: queue)
    mq.publish({ "n" => 2 }, to: queue)
    letter = dead_letters(1).first
    eventually { handled.size == 2 }
    sub.cancel
    expect(Array.new(2) { handled.pop }.sort).to eq([1, 2])
    text = letter.backtrace
    expect(text.encoding).to eq(Encoding::UTF_8)
    expect(text).to be_valid_encoding
    lines = text.split("\n")
    expect(lines.size).to eq(3)
    expect(lines[0]).to eq("app/<script>alert(2)</script>.rb:1:in `x'\\n\\u{1b}[31m\u{FFFD}\\u{0}")
    expect(lines[1]).to start_with("app/huge.rb:2:in `mmm")
    expect(lines[1]).to end_with("… [line cut from #{100 * 1024 + 19} bytes]")
    expect(lines[1].bytesize).to be <= 512
    expect(lines[2]).to eq("app/after.rb:3:in `y'")
    expect(letter.reason).to include("<img src=x onerror=alert(1)> \u{FFFD}\u{FFFD}")
    expect(mq.queue_counts(queue)).to include(ready: 0)
  end

  it "carries the newest failure's backtrace round the ladder, and the history keeps none" do
    seen = Queue.new
    sub = mq.consume(queue, retries: { max_attempts: 2, initial_delay: 0.1, max_delay: 0.1 }) do |m|
      raise BacktraceSpecError, "first" if m.envelope.attempt == 1 # FIRST

      seen << m.headers[header]
      charge(m)
    end
    mq.publish({ "twice" => true }, to: queue)
    letter = dead_letters(1).first
    sub.cancel
    first_line = File.readlines(__FILE__).index { |l| l.include?("# FIRS" + "T") } + 1
    expect(seen.pop.split("\n").first).to start_with("#{__FILE__}:#{first_line}:")
    expect(letter.backtrace.split("\n").first).to match(frame(raising_line, "validate"))
    expect(letter.backtrace).not_to include(":#{first_line}:")
  end

  it "comes from a consumer class and from a handler guarded by Patterns.idempotent" do
    klass = Class.new(AceMQ::Rails::Consumer) do
      retries max_attempts: 1
      def self.name = "BacktraceSpecConsumer"

      def call(_message)
        raise BacktraceSpecError, "from a class" # CLASS RAISES
      end
    end
    klass.queue(queue)
    sub = klass.subscribe(mq)
    mq.publish({ "from" => "class" }, to: queue)
    class_letter = dead_letters(1).first
    sub.cancel
    class_line = File.readlines(__FILE__).index { |l| l.include?("# CLASS" + " RAISES") } + 1
    expect(class_letter.backtrace.split("\n").first).to match(frame("#{__FILE__}:#{class_line}", "call"))

    store = AceMQ::AMQP::Patterns::InMemoryIdempotencyStore.new
    guarded = AceMQ::AMQP::Patterns.idempotent(store) { |m| charge(m) }
    sub = mq.consume(queue, retries: { max_attempts: 2, initial_delay: 0.1, max_delay: 0.1 }, &guarded)
    mq.publish({ "from" => "idempotent" }, to: queue)
    letter = eventually(timeout: 10) do
      mq.peek_dead_letters(queue, limit: 10).find { |l| l.reason.to_s.include?("amount missing") }
    end
    sub.cancel
    lines = letter.backtrace.split("\n")
    expect(lines.first).to match(frame(raising_line, "validate"))
    expect(lines.grep(%r{lib/acemq/})).to eq([]) # the guard's frames are below the handler's: left out
  end

  it "gives a handler that an Exception went through the Exception's frames" do
    sub = mq.consume(queue, retries: { max_attempts: 1 }, on_error: ->(_) {}) do |_m|
      Thread.current.report_on_exception = false
      raise Exception, "not a StandardError" # rubocop:disable Lint/RaiseException -- ABORTS HERE
    end
    mq.publish({ "abort" => true }, to: queue)
    letter = dead_letters(1).first
    sub.cancel
    line = File.readlines(__FILE__).index { |l| l.include?("-- ABORTS" + " HERE") } + 1
    expect(letter.error_class).to eq("AceMQ::AMQP::HandlerAborted")
    expect(letter.backtrace.split("\n").first).to start_with("#{__FILE__}:#{line}:")
  end

  it "puts none on a retry or reject asked for with an Ack" do
    sub = mq.consume(queue, retries: { max_attempts: 1 }) { |_m| AceMQ::AMQP::Ack.reject("no", error: BacktraceSpecError) }
    mq.publish({ "ack" => true }, to: queue)
    letter = dead_letters(1).first
    sub.cancel
    expect(letter.error_class).to eq("BacktraceSpecError")
    expect(letter.backtrace).to be_nil
    expect(letter.headers).not_to have_key(header)
  end
end
