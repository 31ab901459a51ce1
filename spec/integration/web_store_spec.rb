# frozen_string_literal: true

require "delegate"
require "rack"
require "rack/mock"
require "tmpdir"
require "sqlite3"
require "pg"
require "bunny"
require "acemq/web"

# AceMQ::Web in store mode at the Rack level (docs/web.md, "Store mode"):
# the DLQ pages read a SQLDeadLetterStore, on SQLite (a file the library
# opens), PostgreSQL and MariaDB (a connection per thread, as a web server's
# request threads need), with the real broker: its pages, filters, counts, a
# letter's page, the actions with their confirmation, CSRF, read-only, the
# actor and the audit, the overview's column, and a form's bad input.
RSpec.describe "AceMQ::Web with a dead-letter store (Rack)" do
  before(:all) do
    @mq = AceMQ::AMQP::Connection.open(AMQP_URL)
    @bunny = Bunny.new(AMQP_URL, logger: Logger.new(nil)).tap(&:start)
  end

  after(:all) do
    @mq&.close
    @bunny&.close
  end

  # A dead letter published straight to queue's DLQ (as a ladder, or a
  # hostile publisher, would), confirmed.
  def dead_letter(queue, body: "{}", reason: "declined", error_class: nil, type: "order.v1", id: SecureRandom.uuid,
                  headers: {})
    h = { "x-acemq-reason" => reason, "x-acemq-failed-at" => Time.now.to_i, "x-acemq-attempt" => 3 }
    h["x-acemq-error-class"] = error_class if error_class
    ch = @bunny.create_channel
    ch.confirm_select
    ch.default_exchange.publish(body, routing_key: "#{queue}.dlq", message_id: id, type: type, headers: h.merge(headers),
                                      content_type: "application/json", persistent: true)
    ch.wait_for_confirms
    ch.close
    id
  end

  def token_of(response) = response["set-cookie"].to_s[/acemq_csrf=(\h{64})/, 1]

  # The form as a Hash of string keys, given with or without braces.
  # A POST whose body is written as it goes on the wire (a %-escape that is
  # not one, ids[] by hand), with the CSRF pair, to `client`.
  def post_raw(client, path, body, token: "d" * 64)
    client.post(path, input: "#{body}&_csrf=#{token}", "CONTENT_TYPE" => "application/x-www-form-urlencoded",
                      "HTTP_COOKIE" => "acemq_csrf=#{token}")
  end

  def post(path, form = nil, token: "a" * 64, env: {}, **fields)
    form ||= fields
    http.post(path, env.merge(input: URI.encode_www_form(form.merge("_csrf" => token)),
                              "CONTENT_TYPE" => "application/x-www-form-urlencoded",
                              "HTTP_COOKIE" => "acemq_csrf=#{token}"))
  end

  def rows_of(body) = body.scan(/<tr id="row-(\d+)"/).flatten.map(&:to_i)

  WEB_STORE_KINDS = {
    "SQLite" => ->(dir, table) { AceMQ::AMQP::SQLDeadLetterStore.new(path: File.join(dir, "dead.db"), table: table, audit_table: "#{table}_audit") },
    "PostgreSQL" => lambda do |_dir, table|
      AceMQ::AMQP::SQLDeadLetterStore.new(connection: AceMQ::AMQP::SQL.per_thread { AceMQ::AMQP::SQL.open_url(DATABASE_URL) },
                                          table: table, audit_table: "#{table}_audit")
    end,
    "MariaDB" => lambda do |_dir, table|
      AceMQ::AMQP::SQLDeadLetterStore.new(connection: AceMQ::AMQP::SQL.per_thread { AceMQ::AMQP::SQL.open_url(AceMQSpecHelpers::MYSQL_URL) },
                                          table: table, audit_table: "#{table}_audit")
    end
  }.freeze

  WEB_STORE_KINDS.each do |kind, build|
    context "on #{kind}" do
      let(:queue) { unique("web-store") }
      let(:dir) { Dir.mktmpdir("acemq-web-store") }
      let(:table) { "web_dl_#{SecureRandom.hex(4)}" }
      let(:store) { build.call(dir, table).tap(&:create_schema) }
      let(:settings) { { connection: @mq, queues: [queue], runners: [], page_size: 3, dead_letter_store: store, replay_rate: 500 } }
      let(:app) { AceMQ::Web.new(**settings) }
      let(:http) { Rack::MockRequest.new(app) }

      before { AceMQ::AMQP::Topology.new.queue(queue).apply(@mq) }

      after do
        @ingester&.stop(timeout: 5)
        @mq.teardown(AceMQ::AMQP::Topology.new.queue(queue), force: true)
        if kind == "PostgreSQL"
          PG.connect(DATABASE_URL).tap { |c| c.set_notice_processor { |_| } }.then do |c|
            c.exec("DROP TABLE IF EXISTS #{table}, #{table}_audit")
            c.close
          end
        elsif kind == "MariaDB"
          AceMQ::AMQP::SQL.open_url(AceMQSpecHelpers::MYSQL_URL).then do |c|
            c.query("DROP TABLE IF EXISTS #{table}, #{table}_audit")
            c.close
          end
        end
        FileUtils.rm_rf(dir)
      end

      def ingest(n)
        eventually(timeout: 10) { @mq.queue_counts("#{queue}.dlq")[:ready] >= n }
        store.ingest_once(@mq, queue)
      end

      it "pages the store's rows newest first by cursor: a row arriving between pages shifts nothing" do
        7.times { |n| dead_letter(queue, reason: "declined #{n}") }
        ingest(7)
        all = store.list(queue: queue, limit: 100).letters.map(&:id)
        first = http.get("/queues/#{queue}/dlq")
        expect(first.status).to eq(200)
        expect(rows_of(first.body)).to eq(all.first(3))
        cursor = first.body[/after_id=(\d+)"[^>]*id="next"/, 1]
        expect(cursor.to_i).to eq(all[2])
        # A new dead letter arrives between the pages: it is newer, so it
        # is above the cursor, and the next page is the three below it.
        dead_letter(queue, reason: "late")
        expect(ingest(1)).to eq(1)
        second = http.get("/queues/#{queue}/dlq?after_id=#{cursor}")
        expect(rows_of(second.body)).to eq(all[3, 3])
        third = http.get("/queues/#{queue}/dlq?after_id=#{rows_of(second.body).last}")
        expect(rows_of(third.body)).to eq(all.last(1))
        expect(third.body).not_to include(%(id="next"))
        expect(third.body).to include(%(id="newest"))
        seen = rows_of(first.body) + rows_of(second.body) + rows_of(third.body)
        expect(seen).to eq(all)
        top = http.get("/queues/#{queue}/dlq").body
        expect(top).to include("8 dead letters</strong> of #{queue} in the store")
        # 8 reasons: the largest 5 drawn, the other 3 folded.
        by_reason = top[%r{<section[^>]*id="by-reason".*?</section>}m]
        expect(by_reason.scan("<li>").size).to eq(8)
        expect(by_reason).to include("<summary>3 more</summary>")
      end

      it "filters by reason, error class, type, message id and time, and counts by reason and error class as links" do
        dead_letter(queue, reason: "card declined", error_class: "Payments::Declined")
        dead_letter(queue, reason: "card declined", error_class: "Payments::Declined", type: "refund.v1")
        dead_letter(queue, reason: "timeout talking to bank", error_class: "Net::ReadTimeout")
        wanted = dead_letter(queue, reason: "address missing", error_class: nil)
        ingest(4)
        page = http.get("/queues/#{queue}/dlq").body
        expect(page).to include("4 dead letters</strong>")
        by_reason = page[%r{<section[^>]*id="by-reason".*?</section>}m]
        expect(by_reason).to include(%(?reason=card+declined">card declined</a> <span class="badge">2<))
        by_class = page[%r{<section[^>]*id="by-error-class".*?</section>}m]
        expect(by_class).to include(%(?error_class=Payments%3A%3ADeclined">Payments::Declined</a> <span class="badge">2<),
                                    "(none)")
        declined = http.get("/queues/#{queue}/dlq?reason=DECLINED").body
        expect(rows_of(declined).size).to eq(2)
        expect(declined).to include("2 dead letters</strong> of #{queue} in the store matching reason &quot;DECLINED&quot;")
        expect(rows_of(http.get("/queues/#{queue}/dlq?error_class=Net%3A%3AReadTimeout").body).size).to eq(1)
        expect(rows_of(http.get("/queues/#{queue}/dlq?type=refund.v1").body).size).to eq(1)
        found = http.get("/queues/#{queue}/dlq?id=#{wanted}").body
        expect(found.scan(/class="message-id">([^<]+)</).flatten).to eq([wanted])
        expect(rows_of(http.get("/queues/#{queue}/dlq?since=2000-01-01T00:00&before=2000-01-02").body)).to eq([])
        hour_ago = (Time.now.utc - 3600).strftime("%Y-%m-%dT%H:%M")
        expect(rows_of(http.get("/queues/#{queue}/dlq?since=#{hour_ago}&reason=declined").body).size).to eq(2)
        expect(rows_of(http.get("/queues/#{queue}/dlq?before=#{hour_ago}").body)).to eq([])
        expect(http.get("/queues/#{queue}/dlq?type=nothing").body).to include("None match.")
      end

      it "says what waits in the DLQ not yet ingested, and whether an ingester consumes it" do
        dead_letter(queue)
        ingest(1)
        2.times { dead_letter(queue) }
        page = eventually { http.get("/queues/#{queue}/dlq").body.then { |b| b.include?("2 more waiting") && b } }
        expect(page).to include("1 dead letter</strong>", "no ingester is consuming it")
        @ingester = store.ingest(@mq, queue)
        page = eventually(timeout: 10) do
          http.get("/queues/#{queue}/dlq").body.then { |b| b.include?("3 dead letters</strong>") && b.include?("0 more waiting") && b }
        end
        expect(page).to include("an ingester is consuming it")
      end

      it "shows a letter by row id: reason, error class, attempt, times, first route, history, backtrace, every header, the body" do
        dead_letter(queue, body: %({"order":"A-1"}), reason: "card declined", error_class: "Payments::Declined",
                           headers: { "x-acemq-original-exchange" => "shop", "x-acemq-original-routing-key" => "orders.placed",
                                      "x-acemq-backtrace" => "app/pay.rb:12:in `charge'\napp/worker.rb:3",
                                      "x-acemq-history" => [{ "reason" => "bank down", "error_class" => "Timeout",
                                                              "attempts" => 5, "failed_at" => Time.now.to_i - 600 }],
                                      "x-tenant" => "acme" })
        ingest(1)
        id = store.list(queue: queue).letters.first.id
        res = http.get("/queues/#{queue}/dlq/letters/#{id}")
        expect(res.status).to eq(200)
        body = res.body
        expect(body).to include("Dead letter #{id} of #{queue}", %(<dd class="reason">card declined</dd>),
                                %(<dd class="error-class">Payments::Declined</dd>), "<dt>Attempt</dt><dd>3</dd>",
                                "app/pay.rb:12:in `charge&#39;", "bank down (Timeout), 5 attempts, <time",
                                "&quot;x-tenant&quot;: &quot;acme&quot;", "&quot;order&quot;: &quot;A-1&quot;")
        expect(body).to match(%r{exchange <code>shop</code>, routing key <code>orders.placed</code>})
        expect(http.get("/queues/#{queue}/dlq/letters/#{id + 1000}").status).to eq(404)
        other = unique("web-store-other")
        expect(Rack::MockRequest.new(AceMQ::Web.new(**settings, queues: [queue, other])).get("/queues/#{other}/dlq/letters/#{id}").status)
          .to eq(404)
      end

      # A hostile publisher chooses every header and the body (issue 48).
      # Between a good letter before and one after, nothing it sent becomes
      # markup, and no page is a 500.
      it "renders a hostile publisher's headers and body as text between two good letters" do
        pwn = %(<img src=x onerror="window.__pwned=1">)
        good1 = dead_letter(queue, reason: "good one")
        hostile = [
          dead_letter(queue, body: "\xFF\xFE<script>window.__pwned=1</script>".b, reason: pwn, error_class: pwn, type: pwn,
                             headers: { "x-acemq-history" => [5], "x-acemq-failed-at" => pwn, "x-acemq-original-exchange" => pwn,
                                        "x-acemq-original-routing-key" => pwn, "x-acemq-backtrace" => pwn, pwn => pwn }),
          dead_letter(queue, reason: "history a string", headers: { "x-acemq-history" => pwn }),
          dead_letter(queue, reason: "history a table", headers: { "x-acemq-history" => { "reason" => pwn, "failed_at" => "soon" } }),
          dead_letter(queue, reason: "failed_at a string", headers: { "x-acemq-failed-at" => "yesterday" })
        ]
        good2 = dead_letter(queue, reason: "good two")
        ingest(6)
        page = http.get("/queues/#{queue}/dlq?after_id=#{2**62}")
        expect(page.status).to eq(200)
        list = Rack::MockRequest.new(AceMQ::Web.new(**settings, page_size: 50)).get("/queues/#{queue}/dlq").body
        expect(list.scan(/class="message-id">([^<]+)</).flatten).to contain_exactly(good1, *hostile, good2)
        expect(list).not_to include("<img", "<script>window")
        expect(list).to include("&lt;img src=x onerror=&quot;window.__pwned=1&quot;&gt;")
        store.list(queue: queue, limit: 50).letters.each do |l|
          res = http.get("/queues/#{queue}/dlq/letters/#{l.id}")
          expect(res.status).to eq(200)
          main = res.body[%r{<main id="main">.*</main>}m]
          expect(main).not_to include("<img", "<script")
        end
        evil = store.list(queue: queue, id: hostile[0]).letters.first
        evil_page = http.get("/queues/#{queue}/dlq/letters/#{evil.id}").body
        expect(evil_page).to include("not UTF-8", "\u{FFFD}\u{FFFD}&lt;script&gt;", %(<ol id="history"><li>5</li></ol>),
                                     "(its header says <code>&lt;img")
        table = store.list(queue: queue, id: hostile[2]).letters.first
        expect(http.get("/queues/#{queue}/dlq/letters/#{table.id}").body).to include("failed at soon")
        # Filters with the same markup are text too, and find it.
        found = http.get("/queues/#{queue}/dlq?#{URI.encode_www_form('error_class' => pwn)}").body
        expect(rows_of(found)).to eq([evil.id])
        expect(found).not_to include("<img")
      end

      it "replays the selected and all matching after asking, at c.replay_rate, as c.actor, and audits each" do
        4.times { |n| dead_letter(queue, reason: n.even? ? "even #{n}" : "odd #{n}") }
        ingest(4)
        rows = store.list(queue: queue, reason: "even").letters.map(&:id)
        app = AceMQ::Web.new(**settings, actor: ->(env) { "alice via #{env['HTTP_X_OPERATOR']}" })
        http = Rack::MockRequest.new(app)
        token = "b" * 64
        form = ->(path, f) { http.post(path, input: URI.encode_www_form(f.merge("_csrf" => token)), "CONTENT_TYPE" => "application/x-www-form-urlencoded", "HTTP_COOKIE" => "acemq_csrf=#{token}", "HTTP_X_OPERATOR" => "sso") }
        ask = form.call("/queues/#{queue}/dlq/replay", "ids[]" => rows[0].to_s)
        expect(ask.body).to include("Replay 1 dead letter of #{queue} from the store to #{queue}?", %(id="actor">alice via sso<))
        expect(@mq.queue_counts(queue)[:ready]).to eq(0)
        done = form.call("/queues/#{queue}/dlq/replay", "ids[]" => rows[0].to_s, "confirmed" => "yes")
        expect(done.body).to include("Replayed 1 dead letter of #{queue} from the store to #{queue}")
        eventually { @mq.queue_counts(queue)[:ready] == 1 }
        expect(store.find(rows[0])).to be_nil
        confirm = form.call("/queues/#{queue}/dlq/replay", "scope" => "filter", "reason" => "odd")
        expect(confirm.body).to include("Replay every dead letter of #{queue} in the store matching reason &quot;odd&quot;",
                                        "2 dead letters match now")
        expect(confirm.body).to include(%(<input type="hidden" name="reason" value="odd">))
        # The snapshot is taken at submit (docs/web.md): one that arrives
        # between the confirmation and the click is replayed too.
        dead_letter(queue, reason: "odd late")
        ingest(1)
        done = form.call("/queues/#{queue}/dlq/replay", "scope" => "filter", "reason" => "odd", "confirmed" => "yes")
        expect(done.body).to include("Replayed 3 dead letters")
        eventually { @mq.queue_counts(queue)[:ready] == 4 }
        expect(store.counts(queue: queue)[:total]).to eq(1)
        replays = store.audit(limit: 10).select { |a| a[:action] == "replay" }
        expect(replays.map { |a| [a[:actor], a[:count]] }).to eq([["alice via sso", 3], ["alice via sso", 1]])
        expect(replays.first[:detail]).to include("rate" => 500.0)
        expect(replays.first[:detail]["filter"]).to include("reason" => "odd", "queue" => queue)
        expect(replays.last[:detail]).to include("ids" => [rows[0]])
      end

      it "runs a replay longer than 5 s at its rate in the background, listed on /audit, each row sent once" do
        12.times { |n| dead_letter(queue, reason: "slow #{n}") }
        ingest(12)
        slow = Rack::MockRequest.new(AceMQ::Web.new(**settings, replay_rate: 2)) # 12 at 2 a second: 6 s
        token = "c" * 64
        done = slow.post("/queues/#{queue}/dlq/replay", input: URI.encode_www_form("scope" => "filter", "reason" => "slow",
                                                                                  "confirmed" => "yes", "_csrf" => token),
                                                       "CONTENT_TYPE" => "application/x-www-form-urlencoded",
                                                       "HTTP_COOKIE" => "acemq_csrf=#{token}")
        expect(done.status).to eq(200)
        expect(done.body).to include("Replaying 12 dead letters of #{queue} from the store to #{queue} in the background, 2 a second: about 6 s")
        running = slow.get("/audit").body
        expect(running[%r{<table id="background-replays".*?</table>}m]).to include("<td data-label=\"Queue\">#{queue}</td>", ">running<")
        eventually(timeout: 30) { store.counts(queue: queue)[:total].zero? }
        eventually(timeout: 10) { slow.get("/audit").body.include?("done: 12 replayed") }
        expect(@mq.queue_counts(queue)[:ready]).to eq(12) # each once
        expect(store.audit(limit: 1).first).to include(action: "replay", actor: "web", count: 12, queue: queue)
        # A short one answers in the request, as before.
        dead_letter(queue, reason: "quick")
        ingest(1)
        quick = post("/queues/#{queue}/dlq/replay", "scope" => "filter", "reason" => "quick", "confirmed" => "yes")
        expect(quick.body).to include("Replayed 1 dead letter")
      end

      it "refuses a filter sent as a list, a %-escape that is not one, and a day that does not exist: never read as no filter" do
        3.times { |n| dead_letter(queue, reason: "keep #{n}") }
        ingest(3)
        # Each of these once replayed every dead letter of the queue.
        [{ "reason[]" => "zzz-nomatch" }, { "type[]" => "x" }].each do |f|
          r = post("/queues/#{queue}/dlq/replay", { "scope" => "filter", "confirmed" => "yes" }.merge(f))
          expect(r.status).to eq(400)
          expect(r.body).to include("takes one value")
        end
        raw = post_raw(http, "/queues/#{queue}/dlq/replay", "scope=filter&reason=zzz%G1&confirmed=yes")
        expect(raw.status).to eq(400)
        expect(raw.body).to include("could not be read")
        expect(app.call(Rack::MockRequest.env_for("/queues/#{queue}/dlq").merge("QUERY_STRING" => "reason=%G1zzz")).first).to eq(400)
        expect(http.get("/queues/#{queue}/dlq?reason[]=x").status).to eq(400)
        expect(http.get("/queues/#{queue}/dlq?since=2026-02-30T00:00").status).to eq(400)
        expect(store.counts(queue: queue)[:total]).to eq(3)
        expect(@mq.queue_counts(queue)[:ready]).to eq(0)
      end

      it "refuses a replay rate it cannot keep when the app is built, not at the first replay" do
        [0, -1, 1e-300, Float::NAN, "abc"].each do |r|
          expect { AceMQ::Web.new(**settings, replay_rate: r) }.to raise_error(AceMQ::AMQP::ConfigurationError, /rate/)
        end
        expect(AceMQ::Web.new(**settings, replay_rate: 0.5)).to be_a(AceMQ::Web)
      end

      it "discards the selected, purges the matching, and a purge without a filter only with all=yes" do
        5.times { |n| dead_letter(queue, reason: n < 2 ? "spam #{n}" : "keep #{n}") }
        ingest(5)
        rows = store.list(queue: queue).letters.map(&:id)
        discarded = post("/queues/#{queue}/dlq/discard", "ids[]" => rows[0].to_s, "confirmed" => "yes")
        expect(discarded.body).to include("Discarded 1 dead letter of #{queue} from the store.")
        # One selected twice (another operator's discard first) is said.
        again = post("/queues/#{queue}/dlq/discard", "ids[]" => [rows[0].to_s, rows[1].to_s], "confirmed" => "yes")
        expect(again.body).to include("Discarded 1 dead letter", "1 selected one no longer there")
        ask = post("/queues/#{queue}/dlq/purge", "reason" => "spam")
        expect(ask.body).to include("Purge every dead letter of #{queue} in the store matching reason &quot;spam&quot; for good?")
        purged = post("/queues/#{queue}/dlq/purge", "reason" => "spam", "confirmed" => "yes")
        expect(purged.body).to include("Purged ")
        expect(store.counts(queue: queue)[:total]).to eq(store.list(queue: queue).letters.count { |l| l.reason.start_with?("keep") })
        refused = post("/queues/#{queue}/dlq/purge", "confirmed" => "yes")
        expect(refused.status).to eq(400)
        expect(refused.body).to include("all=yes")
        blank = post("/queues/#{queue}/dlq/purge", "reason" => "  ", "confirmed" => "yes")
        expect(blank.status).to eq(400)
        left = store.counts(queue: queue)[:total]
        expect(left).to be_positive
        all = post("/queues/#{queue}/dlq/purge", "all" => "yes", "confirmed" => "yes")
        expect(all.body).to include("Purged #{left} dead letter", "(all of them)")
        expect(store.counts(queue: queue)[:total]).to eq(0)
        actions = store.audit(limit: 10).map { |a| [a[:action], a[:actor]] }
        expect(actions.map(&:last).uniq).to eq(["web"])
        expect(actions.map(&:first).sort).to eq(%w[discard discard purge purge])
        # Selected ids are one queue's: the audit names it, as a filter's.
        expect(store.audit(limit: 10).map { _1[:queue] }.uniq).to eq([queue])
      end

      it "lists the audit on /audit and as JSON, escaped, with REMOTE_USER as the default actor" do
        dead_letter(queue)
        ingest(1)
        row = store.list(queue: queue).letters.first.id
        post("/queues/#{queue}/dlq/discard", { "ids[]" => row.to_s, "confirmed" => "yes" }, env: { "REMOTE_USER" => "<b>bob</b>" })
        page = http.get("/audit")
        expect(page.status).to eq(200)
        expect(page.body).to include(%(<td data-label="Who" class="actor">&lt;b&gt;bob&lt;/b&gt;</td>), %(class="action">discard<),
                                     "{&quot;ids&quot;:[#{row}]}")
        api = http.get("/api/audit?limit=1")
        expect(api.status).to eq(200)
        expect(api["content-type"]).to eq("application/json")
        rows = JSON.parse(api.body)["audit"]
        expect(rows.size).to eq(1)
        expect(rows.first).to include("actor" => "<b>bob</b>", "action" => "discard", "count" => 1, "detail" => { "ids" => [row] })
        # As the page's script JSON: <, > and & escaped, the same JSON.
        expect(api.body).not_to include("<b>")
        expect(api.body).to include("\\u003cb\\u003ebob")
        expect(http.get("/api/audit?limit=0").status).to eq(400)
        expect(JSON.parse(http.get("/api/audit?limit=abc").body)["error"]).to include("limit")
        expect(http.get("/").body).to include(%(id="audit-link"))
      end

      it "read-only: no action drawn, a POST refused with 403; a POST without the CSRF pair refused too" do
        dead_letter(queue)
        ingest(1)
        row = store.list(queue: queue).letters.first.id
        viewer = Rack::MockRequest.new(AceMQ::Web.new(**settings, read_only: true))
        page = viewer.get("/queues/#{queue}/dlq").body
        expect(page).to include("1 dead letter</strong>")
        expect(page).not_to include("Replay selected", "Purge all", %(name="ids[]"))
        expect(viewer.get("/queues/#{queue}/dlq/letters/#{row}").body).not_to include("Discard…")
        refused = viewer.post("/queues/#{queue}/dlq/purge", input: "all=yes&confirmed=yes")
        expect(refused.status).to eq(403)
        forged = http.post("/queues/#{queue}/dlq/discard", input: "ids[]=#{row}&confirmed=yes&_csrf=#{'c' * 64}",
                                                             "CONTENT_TYPE" => "application/x-www-form-urlencoded")
        expect(forged.status).to eq(403)
        expect(store.find(row)).not_to be_nil
      end

      it "answers a form's bad input with a 400 saying what, never a 500, and changes nothing" do
        dead_letter(queue)
        ingest(1)
        bad = {
          "?after_id=abc" => "after_id", "?after_id=-3" => "after_id", "?after_id=99999999999999999999999" => "after_id",
          "?colour=red" => "unknown parameter", "?reason=%FF%FE" => "not UTF-8", "?type=a%00b" => "NUL",
          "?since=yesterday" => "since", "?before=2026-13-45" => "before"
        }
        bad.each do |query, said|
          res = http.get("/queues/#{queue}/dlq#{query}")
          expect([query, res.status]).to eq([query, 400])
          expect(res.body).to include(said)
        end
        expect(http.get("/queues/#{queue}/dlq/letters/abc").status).to eq(400)
        expect(post("/queues/#{queue}/dlq/discard", "ids[]" => "1 OR 1=1", "confirmed" => "yes").status).to eq(400)
        expect(post("/queues/#{queue}/dlq/replay", "scope" => "filter", "colour" => "red", "confirmed" => "yes").status).to eq(400)
        expect(post("/queues/#{queue}/dlq/purge", "since" => "soon", "confirmed" => "yes").status).to eq(400)
        expect(store.counts(queue: queue)[:total]).to eq(1)
        expect(store.audit(limit: 10)).to eq([])
      end

      it "reads the store with the broker down, saying what waits is unknown; a replay then says the broker is down" do
        dead_letter(queue, reason: "while the broker is away")
        ingest(1)
        row = store.list(queue: queue).letters.first.id
        away = Rack::MockRequest.new(AceMQ::Web.new(**settings, connection: nil, url: "amqp://guest:guest@127.0.0.1:1"))
        page = away.get("/queues/#{queue}/dlq")
        expect(page.status).to eq(200)
        expect(page.body).to include("1 dead letter</strong>", "while the broker is away", "waits in #{queue}.dlq is unknown")
        expect(away.get("/queues/#{queue}/dlq/letters/#{row}").status).to eq(200)
        replay = post_raw(away, "/queues/#{queue}/dlq/replay", "ids[]=#{row}&confirmed=yes")
        expect(replay.status).to eq(503)
        expect(replay.body).to include("Broker unreachable")
        expect(store.find(row)).not_to be_nil
      end

      it "shows the store's total per queue on the overview from one grouped counts call, and what waits un-ingested" do
        other = unique("web-store-b")
        AceMQ::AMQP::Topology.new.queue(other).apply(@mq)
        3.times { dead_letter(queue) }
        dead_letter(other)
        ingest(3)
        eventually(timeout: 10) { @mq.queue_counts("#{other}.dlq")[:ready] == 1 }
        store.ingest_once(@mq, other)
        2.times { dead_letter(queue) }
        calls = []
        counting = Class.new(SimpleDelegator) do
          define_method(:counts) { |**kw| calls << kw; __getobj__.counts(**kw) }
        end.new(store)
        http = Rack::MockRequest.new(AceMQ::Web.new(**settings, queues: [queue, other], dead_letter_store: counting))
        values = eventually(timeout: 5) do
          JSON.parse(http.get("/overview.json").body)["values"].then { |v| v["q:#{queue}:dlq-waiting"] == "+2 waiting" && v }
        end
        expect(values).to include("q:#{queue}:dlq" => "3", "q:#{other}:dlq" => "1", "q:#{other}:dlq-waiting" => "")
        calls.clear
        page = http.get("/").body
        expect(calls.size).to eq(1)
        expect(page).to include(%(data-k="q:#{queue}:dlq">3</a>), "+2 waiting")
      ensure
        @mq.teardown(AceMQ::AMQP::Topology.new.queue(other), force: true) if other
      end
    end
  end

  context "where the store comes from" do
    before { require "acemq/rails" }
    after { AceMQ::Rails.config.dead_letter_store = nil }

    it "defaults to AceMQ::Rails.config.dead_letter_store (the runner's), resolved the runner's way; false turns it off" do
      dir = Dir.mktmpdir("acemq-web-store")
      path = File.join(dir, "dead.db")
      AceMQ::AMQP::SQLDeadLetterStore.new(path: path).create_schema
      built = 0
      AceMQ::Rails.config.dead_letter_store = -> { built += 1; AceMQ::AMQP::SQLDeadLetterStore.new(path: path) }
      queue = unique("web-store-rails")
      AceMQ::AMQP::Topology.new.queue(queue).apply(@mq)
      http = Rack::MockRequest.new(AceMQ::Web.new(connection: @mq, queues: [queue], runners: []))
      2.times { expect(http.get("/queues/#{queue}/dlq").body).to include("of #{queue} in the store") }
      expect(built).to eq(1)
      off = Rack::MockRequest.new(AceMQ::Web.new(connection: @mq, queues: [queue], runners: [], dead_letter_store: false))
      expect(off.get("/queues/#{queue}/dlq").body).to include("is empty", "from the head of")
      expect(off.get("/audit").status).to eq(404)
      expect(JSON.parse(off.get("/api/audit").body)["error"]).to include("has none")
      AceMQ::Rails.config.dead_letter_store = :no_such_thing
      broken = Rack::MockRequest.new(AceMQ::Web.new(connection: @mq, queues: [queue], runners: []))
      res = broken.get("/queues/#{queue}/dlq")
      expect(res.status).to eq(503)
      expect(res.body).to include("dead_letter_store is an AceMQ::AMQP::SQLDeadLetterStore")
    ensure
      @mq.teardown(AceMQ::AMQP::Topology.new.queue(queue), force: true) if queue
      FileUtils.rm_rf(dir) if dir
    end

    it "takes :active_record from the Rails config: the store on ActiveRecord::Base's pool, read and acted on" do
      extend ActiveRecordSpecHelpers
      # PostgreSQL where bin/test sets DATABASE_URL, else SQLite.
      kind = ActiveRecordSpecHelpers.postgres? ? :postgres : :sqlite
      establish_active_record(kind)
      AceMQ::AMQP::SQLDeadLetterStore.new(connection: ActiveRecord::Base.connection_pool).then do |s|
        s.schema_sql(kind.to_s).each { |sql| ActiveRecord::Base.connection.execute(sql) }
      end
      AceMQ::Rails.config.dead_letter_store = :active_record
      queue = unique("web-store-ar")
      AceMQ::AMQP::Topology.new.queue(queue).apply(@mq)
      2.times { |n| dead_letter(queue, reason: "ar #{n}") }
      eventually(timeout: 10) { @mq.queue_counts("#{queue}.dlq")[:ready] == 2 }
      app = AceMQ::Web.new(connection: @mq, queues: [queue], runners: [])
      app.source.dead_letter_store.ingest_once(@mq, queue)
      http = Rack::MockRequest.new(app)
      page = http.get("/queues/#{queue}/dlq").body
      expect(page).to include("2 dead letters</strong> of #{queue} in the store", "ar 0", "ar 1")
      row = page[/<tr id="row-(\d+)"/, 1]
      token = "d" * 64
      done = http.post("/queues/#{queue}/dlq/discard", input: "ids[]=#{row}&confirmed=yes&_csrf=#{token}",
                                                         "CONTENT_TYPE" => "application/x-www-form-urlencoded",
                                                         "HTTP_COOKIE" => "acemq_csrf=#{token}")
      expect(done.body).to include("Discarded 1 dead letter")
      expect(ActiveRecord::Base.connection.select_value("SELECT count(*) FROM acemq_dead_letters").to_i).to eq(1)
      expect(ActiveRecord::Base.connection.select_value("SELECT actor FROM acemq_dead_letter_audit")).to eq("web")
    ensure
      @mq.teardown(AceMQ::AMQP::Topology.new.queue(queue), force: true) if queue
      teardown_active_record
    end

    it "acemq web --dead-letter-store opens a SQLite file or a postgres:// URL, and refuses one it cannot open" do
      root = File.expand_path("../..", __dir__)
      queue = unique("web-store-cli")
      AceMQ::AMQP::Topology.new.queue(queue).apply(@mq)
      dir = Dir.mktmpdir("acemq-web-store")
      table = "acemq_dead_letters"
      schema = "web_cli_#{SecureRandom.hex(4)}"
      pg = PG.connect(DATABASE_URL).tap { |c| c.set_notice_processor { |_| } }
      pg.exec("CREATE SCHEMA #{schema}")
      url = "#{DATABASE_URL}?options=-csearch_path%3D#{schema}"
      { File.join(dir, "dead.db") => "SQLite", url => "PostgreSQL" }.each do |target, _name|
        store = AceMQ::AMQP::SQLDeadLetterStore.open(target).tap(&:create_schema)
        dead_letter(queue, reason: "via the command line")
        eventually(timeout: 10) { @mq.queue_counts("#{queue}.dlq")[:ready] == 1 }
        store.ingest_once(@mq, queue)
        reader, writer = IO.pipe
        pid = Process.spawn({ "RUBYLIB" => File.join(root, "lib"), "AMQP_URL" => AMQP_URL }, RbConfig.ruby,
                            File.join(root, "exe", "acemq"), "web", "--queue", queue, "--dead-letter-store", target,
                            "--port", "0", out: writer, err: File::NULL)
        writer.close
        line = reader.wait_readable(30) && reader.gets
        base = line[%r{http://\S+}]
        body = Net::HTTP.get(URI("#{base}queues/#{queue}/dlq"))
        expect(body).to include("1 dead letter</strong> of #{queue} in the store", "via the command line")
        Process.kill("TERM", pid)
        Process.wait(pid)
        pid = nil
        store.purge(queue: queue, actor: "spec")
      ensure
        if pid
          Process.kill("KILL", pid)
          Process.wait(pid)
        end
      end
      expect(pg.exec("SELECT count(*) FROM #{schema}.#{table}").getvalue(0, 0)).to eq("0")
      err = IO.popen([{ "RUBYLIB" => File.join(root, "lib") }, RbConfig.ruby, File.join(root, "exe", "acemq"), "web", "--queue", queue,
                      "--dead-letter-store", "postgres://nobody@127.0.0.1:1/none", "--port", "0", err: [:child, :out]], &:read)
      expect($?.exitstatus).to eq(64)
      expect(err).to include("--dead-letter-store")
    ensure
      pg&.exec("DROP SCHEMA IF EXISTS #{schema} CASCADE")
      pg&.close
      @mq.teardown(AceMQ::AMQP::Topology.new.queue(queue), force: true) if queue
      FileUtils.rm_rf(dir) if dir
    end
  end
end
