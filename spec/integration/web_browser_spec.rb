# frozen_string_literal: true

require "fileutils"
require "tmpdir"

# AceMQ::Web in a real browser: Debian's Chromium and chromedriver, driven by
# Capybara 3.36 and selenium-webdriver 4.4, against spec/dummy (the
# dashboard mounted in its routes behind a session constraint) served in a
# child process, and the real broker. One browser for the whole group.
# Screenshots go to tmp/web-screenshots (ACEMQ_WEB_SCREENSHOTS=docs/web
# writes the ones docs/web.md shows).
browser_missing = WebHelpers.browser_missing

RSpec.describe "AceMQ::Web in Chromium", skip: browser_missing do
  include RunnerHelpers

  SHOTS = File.expand_path(ENV.fetch("ACEMQ_WEB_SCREENSHOTS", "tmp/web-screenshots"), File.expand_path("../..", __dir__))

  before(:all) do
    @mq = AceMQ::AMQP::Connection.open(AMQP_URL)
    @queue = unique("web-orders")
    @other = unique("web-emails")
    topology = AceMQ::AMQP::Topology.new.queue(@queue, type: :quorum).queue(@other, type: :quorum)
    topology.apply(@mq)
    # The consumer "with a bug": it declines every order until the fix is
    # deployed (@state[:fixed]), then charges them.
    @state = { fixed: false }
    @handled = Queue.new
    @sub = @mq.consume(@queue) do |m|
      next AceMQ::AMQP::Ack.reject("card declined for order #{m.payload['order']}") unless @state[:fixed]

      @handled << m.payload["order"]
      AceMQ::AMQP::Ack.accept
    end
    @ids = (1..4).map { |n| @mq.publish({ "order" => n, "amount_cents" => 1000 + n }, to: @queue, type: "order.placed.v1").id }
    eventually(timeout: 10) { @mq.queue_counts("#{@queue}.dlq")&.dig(:ready) == 4 }
    # A runner of its own (on a third queue), whose health endpoint the
    # overview shows.
    @receipts = unique("web-receipts")
    @runner = start_runner({ "QUEUE" => @receipts, "ORIGIN" => unique("web-runner") },
                           app: File.join(RunnerHelpers::ROOT, "spec", "fixtures", "status_app.rb"))
    @pid, @base = WebHelpers.start_dummy(queues: [@queue, @other, @receipts],
                                         runners: ["http://127.0.0.1:#{@runner.health_port}"])

    @profile = Dir.mktmpdir("acemq-chromium")
    @browser = WebHelpers.chromium(:acemq_chromium, @profile)
    FileUtils.mkdir_p(SHOTS)
  end

  after(:all) do
    @browser&.driver&.quit
    WebHelpers.stop(@pid)
    reap_runners if @runner
    @sub&.cancel
    @mq&.close
    FileUtils.rm_rf(@profile) if @profile
  end

  let(:page) { @browser }

  def go(path) = page.visit("#{@base}#{path}")

  def shot(name) = page.save_screenshot(File.join(SHOTS, "#{name}.png"))

  def sign_in(role)
    page.driver.browser.manage.delete_all_cookies
    go("/login/#{role}")
  end

  def dlq_ids = @mq.peek_dead_letters(@queue, limit: 50).map(&:id)

  # Run the block, which leaves the page (a click that submits a form or
  # follows a link), and return once the next document has loaded.
  # Capybara retries a query whose element went stale, but not Chromium's
  # "Node with given id does not belong to the document", which a query
  # begun on the page being left can meet (seen once, in a loaded run).
  def navigating
    page.execute_script("window.acemqLeaving = true")
    yield
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    until begin
      page.evaluate_script("window.acemqLeaving === undefined && document.readyState === 'complete'")
    rescue Selenium::WebDriver::Error::WebDriverError
      false
    end
      raise "the page did not change within 10 s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
    end
  end

  it "refuses the dashboard to a browser without the host's sign-in" do
    page.driver.browser.manage.delete_all_cookies
    go("/acemq")
    expect(page).to have_no_css("h1", text: "Overview")
    expect(page).to have_no_link("Overview")
  end

  it "shows the overview, whose numbers change as messages flow, without a reload" do
    sign_in("admin")
    expect(page).to have_css("h1", text: "Overview")
    ready = "[data-k='q:#{@other}:ready']"
    expect(page).to have_css(ready, exact_text: "0")
    expect(page).to have_css("[data-k='q:#{@queue}:dlq']", exact_text: dlq_ids.size.to_s)
    page.execute_script("window.notReloaded = true")
    5.times { |n| @mq.publish({ "to" => "user#{n}@example.com" }, to: @other) }
    expect(page).to have_css(ready, exact_text: "5", wait: 8)
    expect(page.evaluate_script("window.notReloaded")).to be(true)
    expect(page).to have_css("#runners", text: "StatusSpecConsumer: up")
    shot("overview")
  end

  it "finds a dead letter by a filter, replays it after asking, and the running consumer handles it" do
    sign_in("admin")
    navigating { page.click_link(@queue) }
    expect(page).to have_css("h1", text: @queue)
    expect(page).to have_css("#chart-box svg", minimum: 1, wait: 5)
    shot("queue")
    navigating { page.click_link("Browse its dead letters") }
    page.fill_in("Reason contains", with: "order 3")
    navigating { page.click_button("Filter") }
    expect(page).to have_css("article.letter", count: 1)
    letter = page.find("article.letter")
    expect(letter).to have_text("card declined for order 3")
    expect(letter).to have_text(%("order": 3))
    shot("dlq-filtered")
    @state[:fixed] = true
    navigating { letter.click_button("Replay…") }
    expect(page).to have_css("#question", text: "Replay 1 dead letter from #{@queue}.dlq to #{@queue}?")
    shot("confirm-replay")
    navigating { page.click_button("Yes, replay") }
    expect(page).to have_css("#done", text: "Replayed 1 dead letter from #{@queue}.dlq to #{@queue}")
    shot("replayed")
    expect(eventually(timeout: 10) { @handled.empty? ? nil : @handled.pop }).to eq(3)
    expect(dlq_ids).not_to include(@ids[2])
  end

  # Anyone who may publish to a queue may set a dead letter's headers
  # (issue 48): markup in the history's attempts once ran script in this
  # page, which holds the CSRF token, and a history of another shape made
  # the page a 500, hiding Purge. Between two good letters, none of it runs
  # or breaks anything: the markup reads as characters.
  it "shows a hostile publisher's headers as text between good letters: no script runs, no 500, Purge still there" do
    dlq = "#{@other}.dlq"
    pwn = "<img src=x onerror=\"window.acemqPwned=(window.acemqPwned||0)+1\">"
    good = ->(n) { @mq.publish({ "good" => n }, to: dlq, headers: { "x-acemq-reason" => "good #{n}" }).id }
    ids = [good.call(1)]
    ids << @mq.publish({ "evil" => pwn }, to: dlq, type: "<script>window.acemqPwned=1</script>",
                                          headers: { "x-acemq-reason" => pwn, "x-acemq-error-class" => pwn,
                                                     "x-acemq-failed-at" => pwn,
                                                     "x-acemq-history" => [{ "attempts" => "<img src=x onerror=alert(2)>" },
                                                                           { "attempts" => pwn, "reason" => pwn,
                                                                             "error_class" => pwn, "failed_at" => pwn }] }).id
    ids << @mq.publish({ "odd" => 1 }, to: dlq, headers: { "x-acemq-history" => [5] }).id
    ids << @mq.publish({ "odd" => 2 }, to: dlq, headers: { "x-acemq-history" => { "reason" => "a table" } }).id
    ids << @mq.publish({ "odd" => 3 }, to: dlq, headers: { "x-acemq-history" => [{ "failed_at" => "yesterday" }] }).id
    ids << good.call(2)
    eventually(timeout: 10) { @mq.queue_counts(dlq)&.dig(:ready) == ids.size }
    sign_in("admin")
    go("/acemq/queues/#{@other}/dlq")
    expect(page).to have_css("h1", text: "Dead letters of #{@other}")
    expect(page.all("article.letter").map { |a| a[:id] }).to eq(ids.map { |i| "dl-#{i}" })
    expect(page).to have_button("Purge the DLQ…")
    page.execute_script("document.querySelectorAll('article.letter details').forEach(function (d) { d.open = true; })")
    expect(page).to have_no_css("main img", visible: :all)
    expect(page).to have_no_css("main script", visible: :all)
    expect(page.evaluate_script("window.acemqPwned")).to be_nil
    evil = page.find("#dl-#{ids[1]}")
    expect(evil).to have_text("<img src=x onerror=alert(2)> attempts")
    expect(evil).to have_css("dd.reason", exact_text: pwn)
    expect(evil).to have_text("<script>window.acemqPwned=1</script>")
    expect(page.find("#dl-#{ids[2]}")).to have_css("li", exact_text: "5")
    expect(page.find("#dl-#{ids[3]}")).to have_css("li", text: "a table")
    expect(page.find("#dl-#{ids[4]}")).to have_css("li", text: "failed at yesterday")
  ensure
    @mq.purge_dead_letters(@other)
  end

  it "asks before discarding the selected, and a cancel discards nothing" do
    sign_in("admin")
    go("/acemq/queues/#{@queue}/dlq")
    before = dlq_ids
    page.check("Select #{before.first}")
    navigating { page.click_button("Discard selected…") }
    expect(page).to have_css("#question", text: "Discard 1 dead letter from #{@queue}.dlq for good?")
    shot("confirm-discard")
    navigating { page.click_link("Cancel") }
    expect(dlq_ids).to eq(before)
    # One box selects every letter on the page, and clears them.
    page.check("Select all on this page")
    expect(page.all('input[name="ids[]"]').map(&:checked?).uniq).to eq([true])
    page.uncheck("Select all on this page")
    expect(page.all('input[name="ids[]"]').map(&:checked?).uniq).to eq([false])
    page.check("Select #{before.first}")
    navigating { page.click_button("Discard selected…") }
    navigating { page.click_button("Yes, discard") }
    expect(page).to have_css("#done", text: "Discarded 1 dead letter")
    expect(dlq_ids).to eq(before.drop(1))
  end

  it "in read-only mode shows no action, and refuses one sent anyway" do
    sign_in("viewer")
    go("/acemq/queues/#{@queue}/dlq")
    expect(page).to have_css("#read-only", text: "read-only")
    expect(page).to have_no_button("Replay selected…")
    expect(page).to have_no_button("Purge the DLQ…")
    shot("read-only")
    before = dlq_ids
    # The form the page carries (with its token), sent by hand.
    navigating { page.execute_script(<<~JS) }
      var f = document.getElementById("letters");
      f.action = f.action.replace(/replay$/, "purge");
      var c = document.createElement("input"); c.type = "hidden"; c.name = "confirmed"; c.value = "yes"; f.appendChild(c);
      f.submit();
    JS
    expect(page).to have_css("h1", text: "Read-only")
    expect(dlq_ids).to eq(before)
  end

  it "refuses an action whose form lost its CSRF token" do
    sign_in("admin")
    go("/acemq/queues/#{@queue}/dlq")
    before = dlq_ids
    page.execute_script(<<~JS)
      document.querySelectorAll("input[name=_csrf]").forEach(function (i) { i.remove(); });
    JS
    navigating { page.click_button("Purge the DLQ…") }
    expect(page).to have_css("h1", text: "Refused: CSRF token")
    expect(dlq_ids).to eq(before)
  end

  it "reads on a phone's width, and every action is a labelled control reachable by keyboard" do
    sign_in("admin")
    go("/acemq/queues/#{@queue}/dlq")
    page.driver.browser.manage.window.resize_to(390, 844)
    width = page.evaluate_script("document.documentElement.scrollWidth")
    expect(width).to be <= 390
    shot("dlq-phone")
    page.driver.browser.manage.window.resize_to(1280, 800)
    unlabelled = page.evaluate_script(<<~JS)
      Array.from(document.querySelectorAll("input:not([type=hidden]), button")).filter(function (el) {
        var name = el.getAttribute("aria-label") || (el.labels && el.labels.length && el.labels[0].textContent) || el.textContent;
        return !name || !name.trim() || el.tabIndex < 0;
      }).length
    JS
    expect(unlabelled).to eq(0)
    # Tab from the top reaches the first Replay button; Enter opens the confirmation.
    page.find("body").click
    found = 60.times.any? do
      page.driver.browser.action.send_keys(:tab).perform
      page.evaluate_script("document.activeElement.textContent") == "Replay…"
    end
    expect(found).to be(true)
    navigating { page.driver.browser.action.send_keys(:enter).perform }
    expect(page).to have_css("#question", text: "Replay 1 dead letter")
  end
end
