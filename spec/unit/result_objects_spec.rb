# frozen_string_literal: true

require "spec_helper"
require "acemq/amqp/patterns"
require "sqlite3"

# What the operator's calls return (AceMQ::AMQP::Result): readers, to_h the
# Hash they returned before, frozen; and the Hash forms, which answer the
# same for one deprecation cycle and warn once each, naming the reader.
RSpec.describe "result objects" do
  let(:mq) { AceMQ::AMQP::Connection.open("memory://#{unique('results')}") }
  let(:queue) { unique("payments") }

  # Each warning is once per process: an earlier example (or another file
  # reading a Hash form) must not have spent the one this example expects.
  before { AceMQ::AMQP::Result.instance_variable_get(:@warned).clear }
  after { mq.close unless mq.closed? }

  # The block writes exactly one warning, at this file, matching text.
  def warns_once(text, &block)
    one = satisfy("one line") { |s| s.lines.size == 1 }
    expect(&block).to output(a_string_starting_with("#{__FILE__}:").and(matching(text)).and(one)).to_stderr
  end

  # n dead letters in queue's DLQ, rejected with reason "declined n".
  def dead_letters(n)
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    ids = Array.new(n) { |i| mq.publish({ "n" => i }, to: queue, type: "payment.v1").id }
    sub = mq.consume(queue) { |m| AceMQ::AMQP::Ack.reject("declined #{m.payload['n']}") }
    eventually { mq.queue_depth("#{queue}.dlq")&.fetch(:ready) == n }
    sub.cancel
    ids
  end

  # The Hash forms of result, each answering what old (the Hash it was)
  # answers, key by key.
  def answers_as(result, old)
    old.each do |k, v|
      expect(result[k]).to eq(v)
      expect(result.fetch(k)).to eq(v)
      expect(result.dig(k)).to eq(v)
      expect(result.key?(k)).to be(true)
    end
    expect(result[:nothing_like_this]).to be_nil
    expect { result.fetch(:nothing_like_this) }.to raise_error(KeyError)
    expect(result.keys).to eq(old.keys)
    expect(result.slice(*old.keys.first(2))).to eq(old.slice(*old.keys.first(2)))
    expect(result.each.to_a).to eq(old.to_a)
    expect(result.map { |k, v| [k, v] }).to eq(old.map { |k, v| [k, v] })
    expect(result == old).to be(true)
  end

  def immutable(result)
    expect(result).to be_frozen
    field = result.class.members.first
    expect(result).not_to respond_to(:"#{field}=")
    expect { result.instance_variable_set(:"@#{field}", 1) }.to raise_error(FrozenError)
  end

  describe "Connection#replay_dead_letters" do
    it "returns a DeadLetters::ReplayReport" do
      dead_letters(3)
      report = mq.replay_dead_letters(queue, reason: "declined 1")
      expect(report).to be_a(AceMQ::AMQP::DeadLetters::ReplayReport)
      expect(report).to have_attributes(replayed: 1, skipped: 2)
      expect(report.to_h).to eq(replayed: 1, skipped: 2)
      expect(report.inspect).to eq("#<AceMQ::AMQP::DeadLetters::ReplayReport replayed=1 skipped=2>")
      expect(report).to eq(AceMQ::AMQP::DeadLetters::ReplayReport.new(replayed: 1, skipped: 2))
      immutable(report)
      warns_once(/Connection#replay_dead_letters returns a DeadLetters::ReplayReport now; report\[:replayed\] is deprecated and goes in 0\.2: read report\.replayed \(or report\.to_h\)/) do
        expect(report[:replayed]).to eq(1)
        expect(report[:skipped]).to eq(2)
      end
      $stderr = StringIO.new
      answers_as(report, { replayed: 1, skipped: 2 })
    ensure
      $stderr = STDERR
    end
  end

  describe "Connection#discard_dead_letters and #purge_dead_letters" do
    it "return a DeadLetters::DiscardReport and a DeadLetters::PurgeReport" do
      ids = dead_letters(3)
      report = mq.discard_dead_letters(queue, ids: [ids[0]])
      expect(report).to be_a(AceMQ::AMQP::DeadLetters::DiscardReport)
      expect(report).to have_attributes(discarded: 1, skipped: 2)
      expect(report.to_h).to eq(discarded: 1, skipped: 2)
      immutable(report)
      warns_once(/Connection#discard_dead_letters returns a DeadLetters::DiscardReport now; report.fetch\(:discarded\) is deprecated .*: read report\.discarded/) do
        2.times { expect(report.fetch(:discarded)).to eq(1) }
      end

      purged = mq.purge_dead_letters(queue)
      expect(purged).to be_a(AceMQ::AMQP::DeadLetters::PurgeReport)
      expect(purged.discarded).to eq(2)
      expect(purged.to_h).to eq(discarded: 2)
      immutable(purged)
      warns_once(/Connection#purge_dead_letters returns a DeadLetters::PurgeReport now; report == \{...\} is deprecated .*: read report\.to_h == \{...\}/) do
        2.times { expect(purged == { discarded: 2 }).to be(true) }
      end
    end
  end

  describe "Connection#browse_dead_letters and #peek_dead_letters" do
    it "return a DeadLetters::Page of DeadLetters::Letters, and an Array of them" do
      ids = dead_letters(2)
      page = mq.browse_dead_letters(queue, limit: 1)
      expect(page).to be_a(AceMQ::AMQP::DeadLetters::Page)
      expect(page).to have_attributes(scanned: 2, more: true, moved: 0, partial: false, total: 2, gave_up: false)
      expect(page.more?).to be(true)
      expect(page.most_held).to be_a(Integer)
      letter = page.dead_letters.first
      expect(letter).to be_a(AceMQ::AMQP::DeadLetters::Letter)
      n = JSON.parse(letter.body)["n"] # the DLQ's head: the first rejected
      expect(letter).to have_attributes(id: ids[n], type: "payment.v1", attempt: 1, reason: "declined #{n}",
                                        error_class: nil, backtrace: nil, body: %({"n":#{n}}), exchange: "",
                                        routing_key: queue, history: [])
      expect(letter.failed_at).to be_a(Time).and(be_within(5).of(Time.now))
      expect(letter.headers).to include("x-acemq-reason" => "declined #{n}")

      old_letter = { id: ids[n], type: "payment.v1", attempt: 1, reason: "declined #{n}", error_class: nil, backtrace: nil,
                     failed_at: letter.failed_at, body: %({"n":#{n}}), exchange: "", routing_key: queue,
                     headers: letter.headers, history: [] }
      expect(letter.to_h).to eq(old_letter)
      expect(page.to_h).to eq(dead_letters: [old_letter], scanned: 2, more: true, moved: 0, partial: false, total: 2,
                               gave_up: false, most_held: page.most_held)
      expect(page.inspect).to start_with("#<AceMQ::AMQP::DeadLetters::Page dead_letters=[1 Letter] scanned=2 more=true")
      expect(letter.inspect).to start_with(%(#<AceMQ::AMQP::DeadLetters::Letter id="#{ids[n]}" type="payment.v1"))
      immutable(page)
      immutable(letter)
      expect(page.dead_letters).to be_frozen
      expect(letter.headers).to be_frozen

      warns_once(/Connection#browse_dead_letters returns a DeadLetters::Page now; page\[:dead_letters\] is deprecated .*: read page\.dead_letters/) do
        page[:dead_letters]
        page[:total]
      end
      warns_once(/a dead letter \(peek_dead_letters, browse_dead_letters\) is a DeadLetters::Letter now; letter\[:reason\] is deprecated .*: read letter\.reason/) do
        expect(page[:dead_letters].first[:reason]).to eq("declined #{n}")
      end
      AceMQ::AMQP::Result.instance_variable_get(:@warned).clear
      warns_once(/page\.dig\(:dead_letters, \.\.\.\) is deprecated/) { expect(page.dig(:dead_letters, 0, :history)).to eq([]) }
      $stderr = StringIO.new
      answers_as(letter, old_letter)
      expect(page[:dead_letters] == [old_letter]).to be(true)
      $stderr = STDERR

      peeked = mq.peek_dead_letters(queue, limit: 5)
      expect(peeked).to be_an(Array)
      expect(peeked).to all(be_a(AceMQ::AMQP::DeadLetters::Letter))
      expect(peeked.map(&:id)).to contain_exactly(*ids)
      expect(peeked.first).to eq(letter)
    ensure
      $stderr = STDERR
    end
  end

  describe "Connection#delayed" do
    it "returns an Array of Delays::Level" do
      AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
      mq.publish({ "n" => 1 }, to: queue, delay: 30 * 60)
      levels = mq.delayed
      expect(levels).to be_an(Array)
      level = levels.first
      expect(level).to be_a(AceMQ::AMQP::Delays::Level)
      expect(level).to have_attributes(level: 10, queue: "acemq.delay.10", seconds: 1024, waiting: 1)
      expect(levels.map(&:to_h)).to eq([{ level: 10, queue: "acemq.delay.10", seconds: 1024, waiting: 1 }])
      expect(level.inspect).to eq('#<AceMQ::AMQP::Delays::Level level=10 queue="acemq.delay.10" seconds=1024 waiting=1>')
      immutable(level)
      warns_once(/Connection#delayed returns Delays::Level objects now; level\[:waiting\] is deprecated .*: read level\.waiting/) do
        expect(levels.sum { |l| l[:waiting] }).to eq(1)
      end
      $stderr = StringIO.new
      answers_as(level, { level: 10, queue: "acemq.delay.10", seconds: 1024, waiting: 1 })
      expect(levels == [{ level: 10, queue: "acemq.delay.10", seconds: 1024, waiting: 1 }]).to be(true)
    ensure
      $stderr = STDERR
    end
  end

  describe "SQLOutboxStore#backlog and #stuck" do
    let(:db) { outbox_sqlite(outbox_sqlite_path) }
    let(:store) { AceMQ::AMQP::Patterns::SQLOutboxStore.new(connection: db, table: outbox_table).tap(&:create_schema) }

    it "return a Patterns::OutboxBacklog and an Array of Patterns::OutboxStuckRow" do
      record = AceMQ::AMQP::Patterns.record(mq, { "n" => 1 }, to: "x", exchange: "no-such-exchange")
      db.transaction { store.add(record, connection: db) }
      AceMQ::AMQP::Patterns::OutboxRelay.new(mq, store).sweep

      backlog = store.backlog
      expect(backlog).to be_a(AceMQ::AMQP::Patterns::OutboxBacklog)
      expect(backlog).to have_attributes(count: 1, stuck: 1)
      expect(backlog.oldest_age).to be_between(0, 5)
      expect(backlog.to_h).to eq(count: 1, oldest_age: backlog.oldest_age, stuck: 1)
      immutable(backlog)
      warns_once(/SQLOutboxStore#backlog returns a Patterns::OutboxBacklog now; backlog\[:count\] is deprecated .*: read backlog\.count/) do
        expect(backlog[:count]).to eq(1)
        expect(backlog[:stuck]).to eq(1)
      end

      rows = store.stuck
      expect(rows).to be_an(Array)
      row = rows.first
      expect(row).to be_a(AceMQ::AMQP::Patterns::OutboxStuckRow)
      expect(row).to have_attributes(exchange: "no-such-exchange", routing_key: "x", message_id: record.envelope.id.to_s,
                                     attempts: 1)
      expect(row.last_error).to be_a(String)
      expect(row.next_attempt_at).to be_a(Time).and(be > row.created_at)
      expect(row.created_at).to be_within(5).of(Time.now)
      expect(row.to_h.keys).to eq(%i[id exchange routing_key message_id attempts last_error next_attempt_at created_at])
      immutable(row)
      warns_once(/SQLOutboxStore#stuck returns Patterns::OutboxStuckRow objects now; row\.keys is deprecated .*: read AceMQ::AMQP::Patterns::OutboxStuckRow\.members/) do
        2.times { row.keys }
      end
      $stderr = StringIO.new
      answers_as(backlog, backlog.to_h)
      answers_as(row, row.to_h)
    ensure
      $stderr = STDERR
    end
  end

  it "refuses a result built with a field missing or unknown" do
    report = AceMQ::AMQP::DeadLetters::ReplayReport
    expect { report.new(replayed: 1) }.to raise_error(ArgumentError, /missing skipped/)
    expect { report.new(replayed: 1, skipped: 0, moved: 2) }.to raise_error(ArgumentError, /unknown moved/)
  end

  it "matches a pattern by its fields, and writes JSON as its Hash did" do
    report = AceMQ::AMQP::DeadLetters::ReplayReport.new(replayed: 3, skipped: 0)
    expect(report.then { |r| r in { replayed: 3 } }).to be(true)
    expect(JSON.generate(report)).to eq('{"replayed":3,"skipped":0}')
  end

  # The break-it run of the result objects, each as it was found.
  describe "what an upgrading application does with them" do
    it "answers any other Hash method from to_h, warning once and naming it" do
      dead_letters(2)
      report = mq.replay_dead_letters(queue)
      warns_once(/report\.size is deprecated .* read report\.to_h\.size$/) { expect(report.size).to eq(2) }
      warns_once(/report\.to_a is deprecated/) { expect(report.to_a).to eq(report.to_h.to_a) }
      warns_once(/report\.select is deprecated/) { expect(report.select { |_, v| v == 2 }).to eq(replayed: 2) }
      warns_once(/report\.merge is deprecated/) { expect(report.merge(x: 1)).to eq(report.to_h.merge(x: 1)) }
      expect(report).to respond_to(:any?)
      expect { report.no_such_thing }.to raise_error(NoMethodError)
    end

    it "names the application's line when the Hash form is reached through an RSpec matcher" do
      dead_letters(1)
      report = mq.replay_dead_letters(queue)
      warns_once(/report == \{\.\.\.\} is deprecated/) { expect(report).to eq(replayed: 1, skipped: 0) }
    end

    it "writes a body that is not UTF-8 as base64 in JSON, so one binary body does not fail a page" do
      letter = AceMQ::AMQP::DeadLetters::Letter.new(
        id: "x", type: "t", attempt: 1, reason: "r", error_class: nil, backtrace: nil, failed_at: Time.at(0),
        body: "\xff\xfe not json".b, exchange: "", routing_key: "q", headers: { "h" => "v" }, history: []
      )
      json = JSON.parse(letter.to_json)
      expect(json["body"]).to eq("base64" => ["\xff\xfe not json".b].pack("m0"))
      expect(json["headers"]).to eq("h" => "v")
      # A Time is left as it comes: row.failed_at.utc changes it in place.
      expect(letter.failed_at.utc).to eq(Time.at(0).utc)
      ok = AceMQ::AMQP::DeadLetters::Letter.new(**letter.to_h, body: +"{\"n\":1}")
      expect(JSON.parse(ok.to_json)["body"]).to eq("{\"n\":1}")
    end

    it "freezes the arrays delayed and stuck return, and refuses a stuck limit that is not a count" do
      expect(mq.delayed).to be_frozen
      store = AceMQ::AMQP::Patterns::SQLOutboxStore.new(path: File.join(Dir.mktmpdir, "o.db"))
      store.create_schema
      expect(store.stuck).to be_frozen
      [-1, nil, "x", 1.5].each do |bad|
        expect { store.stuck(bad) }.to raise_error(AceMQ::AMQP::ConfigurationError, /stuck takes how many rows/)
      end
    end
  end
end
