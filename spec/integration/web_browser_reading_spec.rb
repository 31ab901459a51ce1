# frozen_string_literal: true

require "bunny"
require "fileutils"
require "tmpdir"

# AceMQ::Web's DLQ reading in Chromium (issue 48 parts 4-6), on spec/dummy
# served in a child process and the real broker: two operators in two
# browsers on one DLQ, a filter on 100,000 that gives up and says how far
# it read, a replay whose handler still fails (each letter once), a hostile
# publisher's every header and property, and no sideways scroll at 375 px
# on any page. Skipped where web_browser_spec.rb is (no Chromium).
browser_missing = WebHelpers.browser_missing

RSpec.describe "AceMQ::Web reading DLQs in Chromium", skip: browser_missing do
  READING_DEEP = 100_000

  before(:all) do
    @mq = AceMQ::AMQP::Connection.open(AMQP_URL)
    @bunny = Bunny.new(AMQP_URL, logger: Logger.new(nil)).tap(&:start)
    @deep = unique("web-deep")
    @failing = unique("web-failing")
    @hostile = unique("web-hostile")
    topology = AceMQ::AMQP::Topology.new
    [@deep, @failing, @hostile].each { |q| topology.queue(q, type: :quorum) }
    topology.apply(@mq)
    @pid, @base = WebHelpers.start_dummy(queues: [@deep, @failing, @hostile])
    @profiles = []
    @sessions = []
  end

  after(:all) do
    @sessions.each { |s| s.driver.quit rescue nil } # rubocop:disable Style/RescueModifier
    WebHelpers.stop(@pid)
    [@deep, @failing, @hostile].each do |q|
      @mq.teardown(AceMQ::AMQP::Topology.new.queue(q, type: :quorum), force: true) rescue nil # rubocop:disable Style/RescueModifier
    end
    @bunny&.close
    @mq&.close
    @profiles.each { |p| FileUtils.rm_rf(p) }
  end

  # A browser of its own (its own cookies: another operator), signed in.
  def browser(name)
    driver = :"acemq_reading_#{name}"
    profile = Dir.mktmpdir("acemq-chromium")
    @profiles << profile
    session = WebHelpers.chromium(driver, profile)
    @sessions << session
    session.visit("#{@base}/login/admin")
    session
  end

  def alice = (@alice ||= browser(:alice))
  def bob = (@bob ||= browser(:bob))

  def dlq_path(queue, query = "") = "#{@base}/acemq/queues/#{queue}/dlq#{query}"

  # n dead letters straight into a DLQ: AceMQ's batch publish, a thousand
  # at a time with their confirms awaited together (Bunny one by one took
  # 50 s for 100,000 here).
  def fill(queue, n)
    (0...n).each_slice(1_000) do |slice|
      @mq.batch do |b|
        slice.each do |i|
          b.publish({ "order" => i }, to: "#{queue}.dlq", type: "order.placed.v1",
                                      headers: { "x-acemq-reason" => "card declined for order #{i}" })
        end
      end
    end
    eventually(timeout: 60) { @mq.queue_counts("#{queue}.dlq")[:ready] == n }
  end

  it "lets two operators read one DLQ of 100,000: a filter gives up and says how far it read, the other is told to try again" do
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    fill(@deep, READING_DEEP)
    warn format("  (filled %s with %d in %.1f s)", "#{@deep}.dlq", READING_DEEP, Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0)
    alice.visit(dlq_path(@deep))
    expect(alice).to have_css("#total", text: "100,000 dead letters")
    bob.visit(dlq_path(@deep))
    expect(bob).to have_css("#total", text: "100,000 dead letters")
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    filtering = Thread.new { alice.visit(dlq_path(@deep, "?reason=no+such+reason")) }
    eventually(timeout: 10) { @mq.queue_counts("#{@deep}.dlq.reader")&.dig(:consumers) == 1 }
    bob.visit(dlq_path(@deep))
    expect(bob).to have_css("h1", text: "Another operator is reading this DLQ")
    expect(bob).to have_css("#message", text: "try again in a moment")
    filtering.join(60) or raise "the filter did not answer within 60 s"
    took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    gave_up = alice.find("#gave-up")
    expect(gave_up.text).to match(/Gave up after 5\.0 s: read [\d,]+ of 100,000; none matched\. Narrow the filter, or use the dead-letter store/)
    read = gave_up.text[/read ([\d,]+) of/, 1].delete(",").to_i
    expect(read).to be_between(1, READING_DEEP - 1)
    expect(took).to be < 60 # it stopped: the filter's bound is 5 s
    expect(alice).to have_css("#empty", text: "None match among the #{gave_up.text[/read ([\d,]+) of/, 1]} read of 100,000: the rest were not read.")
    bob.visit(dlq_path(@deep))
    expect(bob).to have_css("article.letter", count: 25)
    # None lost, none doubled: ready + what a read still holds.
    counts = []
    eventually(timeout: 30) { (counts << @mq.queue_counts("#{@deep}.dlq")[:ready]).last == READING_DEEP }
  rescue RSpec::Expectations::ExpectationNotMetError
    warn "  (the DLQ's ready counts after the reads: #{counts.last(5).inspect})" if counts&.any?
    raise
  ensure
    # Bunny's queue.purge: purge_dead_letters reads 100,000 one by one.
    @bunny.create_channel.tap { |c| c.queue_purge("#{@deep}.dlq") }.close
  end

  it "replays all matching letters whose handler still fails, each once, and shows them back in the DLQ" do
    calls = Hash.new(0)
    lock = Mutex.new
    sub = @mq.consume(@failing) do |m|
      lock.synchronize { calls[m.id] += 1 }
      AceMQ::AMQP::Ack.reject("card declined for order #{m.payload['order']}")
    end
    ids = Array.new(30) { |n| @mq.publish({ "order" => n }, to: @failing, type: "order.placed.v1").id }
    eventually(timeout: 20) { @mq.queue_counts("#{@failing}.dlq")[:ready] == 30 }
    expect(lock.synchronize { calls.values.uniq }).to eq([1])
    alice.visit(dlq_path(@failing, "?reason=card+declined"))
    expect(alice).to have_css("#total", text: "30 dead letters")
    alice.click_button("Replay all matching…")
    expect(alice).to have_css("#question", text: "Replay every dead letter in #{@failing}.dlq matching")
    alice.click_button("Yes, replay")
    expect(alice).to have_css("#done", text: "Replayed 30 dead letters from #{@failing}.dlq to #{@failing}")
    eventually(timeout: 20) { @mq.queue_counts("#{@failing}.dlq")[:ready] == 30 && lock.synchronize { calls.values.sum } == 60 }
    sleep 0.5 # a further replay would show as a third call; none comes
    expect(lock.synchronize { calls.dup }).to eq(ids.to_h { |id| [id, 2] })
    alice.visit(dlq_path(@failing))
    expect(alice).to have_css("#total", text: "30 dead letters")
    expect(alice.all("article.letter").size).to eq(25)
  ensure
    sub&.cancel
  end

  # Anyone who may publish to a queue chooses every header and property of
  # what lands in its DLQ: markup in each, between two good letters, runs
  # nothing and breaks nothing.
  it "shows a hostile publisher's every header and property as text: no script, no 500" do
    pwn = %(<img src=x onerror="window.acemqPwned=1"><script>window.acemqPwned=2</script>)
    ch = @bunny.create_channel
    ch.confirm_select
    dlq = "#{@hostile}.dlq"
    good = ->(n) { ch.default_exchange.publish(%({"good":#{n}}), routing_key: dlq, message_id: "good-#{n}", headers: { "x-acemq-reason" => "good #{n}" }) }
    good.call(1)
    headers = %w[x-acemq-reason x-acemq-error-class x-acemq-failed-at x-acemq-queue x-acemq-type x-acemq-original-exchange
                 x-acemq-original-routing-key x-acemq-backtrace x-acemq-replayed-by x-acemq-origin traceparent].to_h { |h| [h, pwn] }
    headers[pwn] = pwn
    headers["x-acemq-history"] = [{ "reason" => pwn, "error_class" => pwn, "attempts" => pwn, "failed_at" => pwn }, pwn, [pwn]]
    headers["x-death"] = [{ "reason" => pwn, "queue" => pwn, "exchange" => pwn, "routing-keys" => [pwn], "count" => pwn }]
    headers["x-acemq-attempt"] = pwn
    ch.default_exchange.publish(pwn, routing_key: dlq, message_id: "evil<b>1</b>", type: pwn, correlation_id: pwn, app_id: pwn,
                                     reply_to: pwn, content_type: pwn, content_encoding: "identity", user_id: nil,
                                     headers: headers)
    ch.default_exchange.publish(%({"backtrace":true}), routing_key: dlq, message_id: "with-backtrace",
                                                       headers: { "x-acemq-reason" => "boom",
                                                                  "x-acemq-backtrace" => "app/charge.rb:12:in `charge'\n#{pwn}" })
    good.call(2)
    ch.wait_for_confirms
    ch.close
    eventually(timeout: 10) { @mq.queue_counts(dlq)[:ready] == 4 }
    alice.visit(dlq_path(@hostile))
    expect(alice).to have_css("h1", text: "Dead letters of #{@hostile}")
    expect(alice.all("article.letter").map { |a| a[:id] }).to eq(%w[dl-good-1 dl-evil<b>1</b> dl-with-backtrace dl-good-2])
    alice.execute_script("document.querySelectorAll('article.letter details').forEach(function (d) { d.open = true; })")
    expect(alice).to have_no_css("main img", visible: :all)
    expect(alice).to have_no_css("main script", visible: :all)
    expect(alice).to have_no_css("main b", visible: :all)
    expect(alice.evaluate_script("window.acemqPwned")).to be_nil
    expect(alice).to have_button("Purge the DLQ…")
    evil = alice.find(:xpath, "//article[@id='dl-evil<b>1</b>']")
    expect(evil).to have_css("dd.reason", text: pwn)
    expect(evil).to have_text(pwn)
    bt = alice.find("#dl-with-backtrace pre.backtrace")
    expect(bt.text).to eq("app/charge.rb:12:in `charge'\n#{pwn}")
  ensure
    @mq.purge_dead_letters(@hostile) rescue nil # rubocop:disable Style/RescueModifier
  end

  it "has no sideways scroll at a phone's 375 px on any page" do
    @mq.publish({ "order" => 1, "note" => "x" * 300 }, to: "#{@failing}.dlq",
                                                     headers: { "x-acemq-reason" => "a-reason-with-no-spaces-#{'y' * 120}",
                                                                "x-acemq-backtrace" => "#{'z' * 200}\nb.rb:1" })
    eventually(timeout: 10) { @mq.queue_counts("#{@failing}.dlq")[:ready].positive? }
    alice.current_window.resize_to(375, 740)
    pages = { "overview" => "#{@base}/acemq", "queue" => "#{@base}/acemq/queues/#{@failing}",
              "dlq" => dlq_path(@failing), "filtered" => dlq_path(@failing, "?reason=order&type=order.placed.v1"),
              "no queue" => "#{@base}/acemq/queues/nope" }
    pages.each do |name, url|
      alice.visit(url)
      expect(alice).to have_css("h1")
      widths = alice.evaluate_script("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
      wide = alice.evaluate_script(<<~JS)
        Array.from(document.querySelectorAll("main *")).filter(function (e) {
          return e.getBoundingClientRect().right > document.documentElement.clientWidth + 1;
        }).slice(0, 3).map(function (e) { return e.tagName + "#" + e.id + "." + e.className + " " + Math.round(e.getBoundingClientRect().width); })
      JS
      expect(widths[0]).to be <= widths[1], "#{name}: scrollWidth #{widths[0]} > clientWidth #{widths[1]} at 375 px: #{wide.inspect}"
    end
    alice.visit(dlq_path(@failing))
    alice.first("button", text: "Replay…").click
    expect(alice).to have_css("#question")
    widths = alice.evaluate_script("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    expect(widths[0]).to be <= widths[1], "confirm: scrollWidth #{widths[0]} > clientWidth #{widths[1]}"
  ensure
    alice.current_window.resize_to(1280, 800)
    @mq.purge_dead_letters(@failing) rescue nil # rubocop:disable Style/RescueModifier
  end
end
