# frozen_string_literal: true

require "bunny"
require "fileutils"
require "net/http"
require "pg"
require "tmpdir"

# AceMQ::Web in store mode in Chromium (docs/web.md, "Store mode"): `acemq
# web --dead-letter-store URL` in a child process, on PostgreSQL (a schema of
# the run's own) and the real broker, ingesters running in this process as a
# runner would run them. Two operators at once on one DLQ, a hostile
# publisher between two good letters, a replay whose handler still fails, a
# filter on 100,000 rows, and the audit naming c.actor. Skipped where
# web_browser_spec.rb is (no Chromium).
browser_missing = WebHelpers.browser_missing

RSpec.describe "AceMQ::Web in store mode in Chromium", skip: browser_missing do
  WEB_STORE_ROOT = File.expand_path("../..", __dir__)
  WEB_STORE_DEEP = 100_000
  WEB_STORE_PAGE = 10
  # Screenshots: tmp/web-screenshots, or (ACEMQ_WEB_SCREENSHOTS=docs/web)
  # the ones docs/web.md shows.
  WEB_STORE_SHOTS = File.expand_path(ENV.fetch("ACEMQ_WEB_SCREENSHOTS", "tmp/web-screenshots"), WEB_STORE_ROOT)

  before(:all) do
    @mq = AceMQ::AMQP::Connection.open(AMQP_URL)
    @bunny = Bunny.new(AMQP_URL, logger: Logger.new(nil)).tap(&:start)
    @queues = { ops: unique("web-store-ops"), hostile: unique("web-store-hostile"), failing: unique("web-store-failing"),
                deep: unique("web-store-deep"), audit: unique("web-store-audit"), phone: unique("web-store-phone"),
                select: unique("web-store-select") }
    topology = AceMQ::AMQP::Topology.new
    @queues.each_value { |q| topology.queue(q) }
    topology.apply(@mq)
    @schema = "web_browser_#{SecureRandom.hex(4)}"
    @pg = PG.connect(DATABASE_URL).tap { |c| c.set_notice_processor { |_| } }
    @pg.exec("CREATE SCHEMA #{@schema}")
    @url = "#{DATABASE_URL}?options=-csearch_path%3D#{@schema}"
    @store = AceMQ::AMQP::SQLDeadLetterStore.open(@url).tap(&:create_schema)
    @ingesters = %i[ops hostile failing audit phone select].map { |k| @store.ingest(@mq, @queues[k], retry_every: 0.5) }
    reader, writer = IO.pipe
    args = ["web", "-r", File.join(WEB_STORE_ROOT, "spec/fixtures/web_store_app.rb"), "--dead-letter-store", @url,
            "--replay-rate", "200", "--port", "0", "--runner", "http://127.0.0.1:1"]
    @queues.each_value { |q| args.push("--queue", q) }
    @server = Process.spawn({ "RUBYLIB" => File.join(WEB_STORE_ROOT, "lib"), "AMQP_URL" => AMQP_URL,
                              "ACEMQ_WEB_PAGE_SIZE" => WEB_STORE_PAGE.to_s },
                            RbConfig.ruby, File.join(WEB_STORE_ROOT, "exe", "acemq"), *args, out: writer, err: File::NULL)
    writer.close
    line = reader.wait_readable(60) && reader.gets
    raise "acemq web did not start: #{line.inspect}" unless line&.include?("http://")

    @base = line[%r{http://\S+}].chomp("/")
    Thread.new { reader.each_line { nil } }
    @profiles = []
    @sessions = []
  end

  after(:all) do
    @sessions&.each { |s| s.driver.quit rescue nil } # rubocop:disable Style/RescueModifier
    if @server
      Process.kill("TERM", @server)
      Process.wait(@server)
    end
    @ingesters&.each { |i| i.stop(timeout: 5) }
    @queues&.each_value { |q| @mq.teardown(AceMQ::AMQP::Topology.new.queue(q), force: true) rescue nil } # rubocop:disable Style/RescueModifier
    @pg&.exec("DROP SCHEMA IF EXISTS #{@schema} CASCADE")
    @pg&.close
    @bunny&.close
    @mq&.close
    @profiles&.each { |p| FileUtils.rm_rf(p) }
  end

  # A browser of its own (its own cookies: another operator), whose
  # "operator" cookie is what the fixture's c.actor reads.
  def browser(name, operator: name)
    driver = :"acemq_store_#{name}"
    profile = Dir.mktmpdir("acemq-chromium")
    @profiles << profile
    session = WebHelpers.chromium(driver, profile)
    @sessions << session
    session.visit("#{@base}/audit")
    session.driver.browser.manage.add_cookie(name: "operator", value: operator.to_s)
    session
  end

  def shot(session, name)
    FileUtils.mkdir_p(WEB_STORE_SHOTS)
    session.save_screenshot(File.join(WEB_STORE_SHOTS, "#{name}.png"))
  end

  def alice = (@alice ||= browser(:alice))
  def bob = (@bob ||= browser(:bob))

  def dlq_path(queue, query = {})
    "#{@base}/queues/#{queue}/dlq#{query.empty? ? '' : "?#{URI.encode_www_form(query)}"}"
  end

  # The row ids a store page shows, in its order.
  def rows_on(session) = session.all("tr.row").map { |tr| tr[:id].delete_prefix("row-").to_i }

  # Dead letters straight into queue's DLQ, confirmed, then waited for in
  # the store (the ingester takes them).
  def dead_letters(queue, reasons, error_class: nil, wait: true)
    ch = @bunny.create_channel
    ch.confirm_select
    before = @store.counts(queue: queue)[:total]
    reasons.each do |reason|
      h = { "x-acemq-reason" => reason, "x-acemq-failed-at" => Time.now.to_i }
      h["x-acemq-error-class"] = error_class.respond_to?(:call) ? error_class.call(reason) : error_class if error_class
      ch.default_exchange.publish(%({"reason":#{reason.to_json}}), routing_key: "#{queue}.dlq", headers: h,
                                                                     message_id: SecureRandom.uuid, type: "order.v1")
    end
    ch.wait_for_confirms
    ch.close
    eventually(timeout: 20) { @store.counts(queue: queue)[:total] == before + reasons.size } if wait
  end

  # The page the session shows, then each older one (Older →) until there
  # is none: the row ids seen, page by page.
  def page_through(session)
    pages = []
    loop do
      pages << rows_on(session)
      break unless session.has_css?("#next", wait: 0)

      session.click_link("Older →")
      expect(session).to have_css("#cost", text: "Below row #{pages.last.last}:")
    end
    pages
  end

  it "lets two operators page, filter, replay and discard one DLQ at once: each sees consistent pages, no row twice or skipped" do
    q = @queues[:ops]
    dead_letters(q, (0...60).map { |n| "declined #{n}" }, error_class: ->(r) { r[/\d+/].to_i.even? ? "Shop::Declined" : "Shop::Timeout" })
    declined = @store.list(queue: q, error_class: "Shop::Declined", limit: 100).letters.map(&:id)
    expect(declined.size).to eq(30)
    # Alice filters by error class: the first of three pages.
    alice.visit(dlq_path(q))
    alice.click_link("Shop::Declined")
    expect(alice).to have_css("#total", text: "30 dead letters of #{q} in the store matching error class")
    expect(rows_on(alice)).to eq(declined.first(10))
    shot(alice, "store-dlq")
    # Bob, unfiltered, on his first page.
    bob.visit(dlq_path(q))
    expect(rows_on(bob).size).to eq(10)
    # Bob, in a second tab (a browser of its own, signed in as him),
    # discards two rows Alice has not reached yet and replays one from its
    # page; new dead letters arrive, newer than both cursors.
    bob_tab = browser(:bob_tab, operator: "bob")
    bob_tab.visit(dlq_path(q, "error_class" => "Shop::Declined", "after_id" => declined[9]))
    gone = declined[10, 2] + [declined[25]]
    gone.first(2).each { |id| bob_tab.check("Select row #{id}") }
    bob_tab.click_button("Discard selected…")
    expect(bob_tab).to have_css("#question", text: "Discard 2 dead letters of #{q} from the store for good?")
    bob_tab.click_button("Yes, discard")
    expect(bob_tab).to have_css("#done", text: "Discarded 2 dead letters of #{q} from the store.")
    bob_tab.visit("#{@base}/queues/#{q}/dlq/letters/#{gone.last}")
    bob_tab.click_button("Replay…")
    bob_tab.click_button("Yes, replay")
    expect(bob_tab).to have_css("#done", text: "Replayed 1 dead letter")
    left = @store.list(queue: q, limit: 1000).letters.map(&:id)
    dead_letters(q, (60...66).map { |n| "declined #{n}" }, error_class: "Shop::Declined")
    # Bob pages on from his first page: what was there when he reads each
    # page, below his cursor, once each; none of the new rows (above it).
    bob_pages = page_through(bob)
    bob_seen = bob_pages.flatten
    expect(bob_seen).to eq(bob_seen.uniq)
    expect(bob_seen).to eq(bob_seen.sort.reverse)
    expect(bob_seen).to eq(bob_pages.first + (left - bob_pages.first).select { |id| id < bob_pages.first.last })
    expect(bob_seen.size).to eq(57)
    # Alice goes on from where she was: none of the new rows, none of Bob's
    # gone ones, every other one once, in order.
    alice_pages = page_through(alice)
    alice_seen = alice_pages.flatten
    expect(alice_seen).to eq(alice_seen.uniq)
    expect(alice_seen).to eq(declined - gone)
    expect(alice_pages.map(&:size)).to eq([10, 10, 7])
    bobs = @store.audit(limit: 100).select { |a| a[:actor] == "bob" }.map { |a| [a[:action], a[:count]] }
    expect(bobs).to eq([["replay", 1], ["discard", 2]])
  end

  # Anyone who may publish to a queue chooses every header and the body of
  # what lands in its DLQ, and the ingester stores it all (issue 48).
  it "shows a hostile publisher's headers between a good letter before and one after: no script runs, no markup, no 500" do
    q = @queues[:hostile]
    pwn = %(<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>)
    ch = @bunny.create_channel
    ch.confirm_select
    publish = lambda do |body, id, headers, type: "order.v1"|
      ch.default_exchange.publish(body, routing_key: "#{q}.dlq", message_id: id, type: type, headers: headers,
                                        correlation_id: pwn, app_id: pwn, reply_to: pwn)
    end
    publish.call(%({"good":1}), "good-before", { "x-acemq-reason" => "good before" })
    every = %w[x-acemq-reason x-acemq-error-class x-acemq-failed-at x-acemq-original-exchange x-acemq-original-routing-key
               x-acemq-backtrace x-acemq-replayed-by x-acemq-origin traceparent].to_h { |h| [h, pwn] }
    publish.call("\xFF\xFE#{pwn}".b, "evil<b>1</b>", every.merge(pwn => pwn, "x-acemq-history" => [5]), type: pwn)
    publish.call("{}", "history-string", { "x-acemq-reason" => pwn, "x-acemq-history" => pwn })
    publish.call("{}", "history-table", { "x-acemq-reason" => "table", "x-acemq-history" => { "reason" => pwn, "failed_at" => pwn } })
    publish.call("{}", "failed-at-string", { "x-acemq-reason" => "string time", "x-acemq-failed-at" => "yesterday <i>noon</i>" })
    publish.call(%({"good":2}), "good-after", { "x-acemq-reason" => "good after" })
    ch.wait_for_confirms
    ch.close
    eventually(timeout: 20) { @store.counts(queue: q)[:total] == 6 }
    clean = lambda do |session|
      expect(session).to have_no_css("main img, main script, main b, main i", visible: :all)
      expect(session.evaluate_script("window.__pwned")).to be_nil
      expect(session).to have_no_text("Internal Server Error")
    end
    alice.visit(dlq_path(q))
    expect(alice).to have_css("h1", text: "Dead letters of #{q}")
    ids = alice.all("code.message-id").map(&:text)
    expect(ids).to include("good-before", "good-after", "evil<b>1</b>")
    expect(ids.size).to eq(6)
    clean.call(alice)
    expect(alice).to have_css("td.reason", exact_text: pwn)
    expect(alice).to have_css("#by-reason a", exact_text: pwn)
    @store.list(queue: q).letters.each do |l|
      alice.visit("#{@base}/queues/#{q}/dlq/letters/#{l.id}")
      expect(alice).to have_css("h1", text: "Dead letter #{l.id} of #{q}")
      clean.call(alice)
    end
    evil = @store.list(queue: q, id: "evil<b>1</b>").letters.first
    alice.visit("#{@base}/queues/#{q}/dlq/letters/#{evil.id}")
    expect(alice).to have_css("#history li", exact_text: "5")
    expect(alice).to have_css("dd.reason", exact_text: pwn)
    expect(alice).to have_css("dd.type", exact_text: pwn)
    expect(alice.find("#body").text).to start_with("\u{FFFD}\u{FFFD}<img")
    expect(alice).to have_css("#backtrace", exact_text: pwn)
    expect(alice.find("#headers").text).to include(%("x-acemq-original-exchange": "#{pwn.gsub('"', '\"')}"))
    table = @store.list(queue: q, id: "history-table").letters.first
    alice.visit("#{@base}/queues/#{q}/dlq/letters/#{table.id}")
    expect(alice).to have_css("#history li", text: "failed at #{pwn}")
    late = @store.list(queue: q, id: "failed-at-string").letters.first
    alice.visit("#{@base}/queues/#{q}/dlq/letters/#{late.id}")
    expect(alice).to have_css("dd.failed", text: "its header says yesterday <i>noon</i>")
    clean.call(alice)
    # A filter made of the same markup is text in the form and the links.
    alice.visit(dlq_path(q, "reason" => pwn))
    expect(alice.all("tr.row").size).to eq(2)
    expect(alice.find("#f-reason").value).to eq(pwn)
    clean.call(alice)
  end

  it "replays letters whose handler still fails from the page: each runs once per replay and comes back as a new row showing the replay" do
    q = @queues[:failing]
    calls = Hash.new(0)
    lock = Mutex.new
    sub = @mq.consume(q, retries: { max_attempts: 1 }) do |m|
      lock.synchronize { calls[m.id] += 1 }
      AceMQ::AMQP::Ack.reject("card declined for order #{m.payload['order']}")
    end
    ids = Array.new(12) { |n| @mq.publish({ "order" => n }, to: q, type: "order.placed.v1").id }
    eventually(timeout: 20) { @store.counts(queue: q)[:total] == 12 }
    expect(lock.synchronize { calls.dup }).to eq(ids.to_h { |id| [id, 1] })
    first_rows = @store.list(queue: q, limit: 100).letters.map(&:id)
    alice.visit(dlq_path(q, "reason" => "card declined"))
    expect(alice).to have_css("#total", text: "12 dead letters")
    alice.click_button("Replay all matching…")
    expect(alice).to have_css("#matching", text: "12 dead letters match now")
    alice.click_button("Yes, replay")
    expect(alice).to have_css("#done", text: "Replayed 12 dead letters of #{q} from the store to #{q}")
    # Each copy fails again and is ingested as a new row; the replayed rows
    # are gone.
    eventually(timeout: 20) do
      rows = @store.list(queue: q, limit: 100).letters
      rows.size == 12 && (rows.map(&:id) & first_rows).empty? && lock.synchronize { calls.values.sum } == 24
    end
    expect(@mq.queue_counts(q)[:ready]).to eq(0)
    expect(@mq.queue_counts("#{q}.dlq")[:ready]).to eq(0)
    expect(lock.synchronize { calls.dup }).to eq(ids.to_h { |id| [id, 2] })
    replay = @store.audit(limit: 20).find { |a| a[:action] == "replay" && a[:actor] == "alice" }
    expect(replay).to include(count: 12)
    back = @store.list(queue: q, limit: 1).letters.first
    expect(back.headers["x-acemq-replayed-by"]).to eq(replay[:detail]["replay"])
    alice.visit("#{@base}/queues/#{q}/dlq/letters/#{back.id}")
    expect(alice).to have_css("#history li", text: "card declined for order")
    expect(alice.find("#headers").text).to include(%("x-acemq-replayed-by": "#{replay[:detail]['replay']}"))
  ensure
    sub&.cancel
  end

  it "selects every letter on the page with one box, and discards just those after asking" do
    q = @queues[:select]
    dead_letters(q, Array.new(5) { |n| "select me #{n}" })
    alice.visit(dlq_path(q))
    shown = rows_on(alice)
    expect(shown.size).to eq(5)
    alice.check("Select all on this page")
    expect(alice.all('input[name="ids[]"]').map(&:checked?)).to eq([true] * 5)
    alice.uncheck("Select all on this page")
    expect(alice.all('input[name="ids[]"]').map(&:checked?)).to eq([false] * 5)
    alice.check("Select all on this page")
    alice.uncheck("Select row #{shown.last}")
    alice.click_button("Discard selected…")
    expect(alice).to have_content("Discard 4 dead letters")
    alice.click_button("Yes, discard")
    expect(alice).to have_css("#done", text: "Discarded 4 dead letters of #{q} from the store.")
    expect(@store.list(queue: q).letters.map(&:id)).to eq([shown.last])
  end

  it "filters a store of 100,000 rows from the page within a generous bound, and says how long it took" do
    q = @queues[:deep]
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    now = Time.now.to_i
    # One INSERT ... SELECT: the store's own columns, 3 rows in 100,000
    # of a rare error class.
    @pg.exec_params(<<~SQL, [q, now])
      INSERT INTO #{@schema}.acemq_dead_letters
        (queue, message_id, content_hash, body, body_encoding, headers, properties, message_type, reason, error_class,
         attempt, failed_at, ingested_at)
      SELECT $1, 'bulk-' || g, md5(g::text), '{"n":' || g || '}', 'utf8', '{}', '{}', 'order.v1',
             CASE WHEN g % 33333 = 7 THEN 'card stolen ' || g ELSE 'card declined ' || g END,
             CASE WHEN g % 33333 = 7 THEN 'Fraud::Stolen' ELSE 'Payments::Declined' END,
             1, $2::bigint - (100000 - g), $2::bigint
      FROM generate_series(1, #{WEB_STORE_DEEP}) g
    SQL
    @pg.exec("VACUUM ANALYZE #{@schema}.acemq_dead_letters")
    filled = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
    alice.visit(dlq_path(q))
    expect(alice).to have_css("#total", text: "100,000 dead letters")
    alice.fill_in("Error class", with: "Fraud::Stolen")
    alice.fill_in("Reason contains", with: "stolen")
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    alice.click_button("Filter")
    expect(alice).to have_css("#total", text: "3 dead letters of #{q} in the store matching", wait: 60)
    took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    server_ms = alice.find("#cost").text[/took ([\d.]+) ms/, 1]
    warn format("  (100,000 rows: inserted in %.1f s; the filter answered in the browser in %.0f ms, %s ms of it the store's page and counts)",
                filled, took * 1000, server_ms)
    expect(alice.all("tr.row").size).to eq(3)
    expect(alice.all("td.error-class").map(&:text).uniq).to eq(["Fraud::Stolen"])
    expect(took).to be < 30 # a generous bound, not a benchmark: bench/dead_letters.rb measures
    alice.fill_in("Reason contains", with: "")
    alice.fill_in("Error class", with: "")
    alice.click_button("Filter")
    expect(alice).to have_css("#next")
  ensure
    @pg.exec("DELETE FROM #{@schema}.acemq_dead_letters WHERE queue = '#{q}'")
  end

  it "has no sideways scroll on the store's pages at a phone's 375 px or at 1280 px, whatever a reason holds" do
    q = @queues[:phone]
    dead_letters(q, ["a-reason-with-no-spaces-#{'y' * 150}"], error_class: "Very::Long::#{'Z' * 80}")
    row = @store.list(queue: q).letters.first.id
    shots = File.join(WEB_STORE_ROOT, "tmp", "web-screenshots")
    FileUtils.mkdir_p(shots)
    alice.current_window.resize_to(375, 740)
    { "store-dlq" => dlq_path(q), "store-letter" => "#{@base}/queues/#{q}/dlq/letters/#{row}", "audit" => "#{@base}/audit",
      "overview" => @base }.each do |name, url|
      alice.visit(url)
      expect(alice).to have_css("h1")
      alice.save_screenshot(File.join(shots, "#{name}-phone.png"))
      widths = alice.evaluate_script("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
      expect(widths[0]).to be <= widths[1], "#{name}: scrollWidth #{widths[0]} > clientWidth #{widths[1]} at 375 px"
    end
    alice.current_window.resize_to(1280, 800)
    { "store-dlq-wide" => dlq_path(q), "store-letter-wide" => "#{@base}/queues/#{q}/dlq/letters/#{row}" }.each do |name, url|
      alice.visit(url)
      alice.save_screenshot(File.join(shots, "#{name}.png"))
      widths = alice.evaluate_script("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
      expect(widths[0]).to be <= widths[1], "#{name}: scrollWidth #{widths[0]} > clientWidth #{widths[1]} at 1280 px"
    end
  ensure
    alice.current_window.resize_to(1280, 800)
    @store.purge(queue: q, actor: "spec")
  end

  it "records c.actor's operator for a replay, a discard and a purge, and the audit page shows them" do
    q = @queues[:audit]
    dead_letters(q, %w[one two three four five])
    carol = browser(:carol)
    rows = @store.list(queue: q).letters.map(&:id)
    carol.visit(dlq_path(q))
    carol.check("Select row #{rows[0]}")
    carol.click_button("Replay selected…")
    expect(carol).to have_css("#actor", exact_text: "carol")
    carol.click_button("Yes, replay")
    expect(carol).to have_css("#done", text: "Replayed 1 dead letter")
    carol.visit(dlq_path(q))
    carol.check("Select row #{rows[1]}")
    carol.check("Select row #{rows[2]}")
    carol.click_button("Discard selected…")
    carol.click_button("Yes, discard")
    expect(carol).to have_css("#done", text: "Discarded 2 dead letters")
    carol.visit(dlq_path(q))
    carol.click_button("Purge all of #{q}…")
    expect(carol).to have_css("#question", text: "Purge all of #{q}'s dead letters from the store for good?")
    carol.click_button("Yes, purge")
    expect(carol).to have_css("#done", text: "Purged 2 dead letters of #{q} from the store (all of them).")
    carol.visit(@base)
    carol.find("#audit-link").click
    expect(carol).to have_css("h1", text: "Audit"), carol.text[0, 600]
    shot(carol, "store-audit")
    mine = carol.all("tr.audit-row").select { |tr| tr.find("td.actor").text == "carol" }
    expect(mine.map { |tr| [tr.find("td.action").text, tr.find("td.count").text] }).to eq([%w[purge 2], %w[discard 2], %w[replay 1]])
    expect(mine.first).to have_text(q)
    api = JSON.parse(Net::HTTP.get(URI("#{@base}/api/audit?limit=1000")))["audit"].select { |a| a["actor"] == "carol" }
    expect(api.map { |a| [a["action"], a["count"]] }).to eq([["purge", 2], ["discard", 2], ["replay", 1]])
    expect(api.first).to include("queue" => q, "detail" => { "filter" => { "queue" => q } })
  end
end
