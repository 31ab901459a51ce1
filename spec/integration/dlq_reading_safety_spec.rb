# frozen_string_literal: true

require "bunny"
require "json"
require "open3"
require "rbconfig"

# Reading a DLQ without a store (issue 48 part 4), on the real broker, with
# a second process: one reader at a time per DLQ across processes (the
# exclusive consumer of {dlq}.reader), a filter that gives up after its
# time and says how far it read, never holding more than 1,000
# unacknowledged, and nothing lost by any of it.
RSpec.describe "reading a DLQ: one reader, bounded" do
  SAFETY_ROOT = File.expand_path("../..", __dir__)
  SAFETY_DEEP = 20_000

  before(:all) do
    @bunny = Bunny.new(AMQP_URL, logger: Logger.new(nil)).tap(&:start)
    @mq = AceMQ::AMQP::Connection.open(AMQP_URL)
  end

  after(:all) do
    @mq&.close
    @bunny&.close
  end

  let(:queue) { unique("dlq-safe") }
  let(:dlq) { "#{queue}.dlq" }

  after { @mq.teardown(AceMQ::AMQP::Topology.new.queue(queue, type: :quorum), force: true) }

  # n dead letters published straight into the DLQ (Bunny, confirms
  # awaited together): a DLQ of 20,000 in a few seconds.
  def fill(n)
    AceMQ::AMQP::Topology.new.queue(queue, type: :quorum).apply(@mq)
    ch = @bunny.create_channel
    ch.confirm_select
    n.times do |i|
      ch.default_exchange.publish(%({"n":#{i}}), routing_key: dlq, persistent: true, message_id: "dl-#{i}",
                                                  headers: { "x-acemq-reason" => "declined #{i}" })
    end
    ch.wait_for_confirms
    ch.close
    eventually(timeout: 30) { @mq.queue_counts(dlq)[:ready] == n }
  end

  # Another process reading the DLQ: a filter that matches nothing, for at
  # most `within` seconds; its page's numbers, as JSON on stdout.
  def other_reader(within)
    code = <<~RUBY
      require "acemq"; require "json"
      mq = AceMQ::AMQP::Connection.open(ENV.fetch("AMQP_URL"))
      r = mq.browse_dead_letters(ENV.fetch("Q"), reason: "no reason like this", within: #{within})
      puts JSON.generate(r.to_h.slice(:scanned, :total, :gave_up, :most_held, :partial))
      mq.close
    RUBY
    Open3.popen2({ "AMQP_URL" => AMQP_URL, "Q" => queue, "RUBYLIB" => File.join(SAFETY_ROOT, "lib") }, RbConfig.ruby, "-e", code)
  end

  # None lost and none doubled: the DLQ holds exactly what it held. The
  # broker counts a quorum queue's returns a moment after they are given
  # back, longer on a loaded machine, so the count is read until it
  # settles. A deep read that gave up used to leave up to 200 twice (19 of
  # 20,000 once on 3.10; 14, 102 and 89 on 4.3.6): its last acks were lost
  # to the channel's close, which a quorum queue applies first. The reader
  # now waits for the broker to show what it gave back before it closes.
  def expect_all_back
    seen = []
    eventually(timeout: 30) { (seen << @mq.queue_counts(dlq)[:ready]).last(3).uniq.size == 1 && seen.size >= 3 && seen.last >= SAFETY_DEEP }
    expect(seen.last).to eq(SAFETY_DEEP) # none doubled
  rescue RSpec::Expectations::ExpectationNotMetError
    raise RSpec::Expectations::ExpectationNotMetError, "#{dlq} did not hold #{SAFETY_DEEP} again: ready #{seen.last(5).inspect}"
  end

  it "lets one process read a DLQ at a time: another is told, then reads once the first has finished" do
    fill(SAFETY_DEEP)
    stdin, stdout, child = other_reader(8)
    stdin.close
    lock = "#{dlq}.reader"
    eventually(timeout: 10) { @mq.queue_counts(lock)&.dig(:consumers) == 1 }
    expect { @mq.browse_dead_letters(queue, limit: 5) }.to raise_error(AceMQ::AMQP::BrokerError) { |e|
      expect(e.reply_code).to eq(405)
      expect(e.message).to match(/another reader is reading #{Regexp.escape(dlq)}.*try again/)
    }
    expect { @mq.replay_dead_letters(queue, ids: ["dl-1"]) }.to raise_error(AceMQ::AMQP::BrokerError, /another reader/)
    expect(child.value).to be_success
    theirs = JSON.parse(stdout.read, symbolize_names: true)
    expect(theirs).to include(total: SAFETY_DEEP, gave_up: true, partial: true)
    expect(theirs[:scanned]).to be_between(1, SAFETY_DEEP - 1)
    # Once it has finished, the lock is gone with its channel.
    mine = @mq.browse_dead_letters(queue, limit: 5)
    expect(mine.dead_letters.size).to eq(5)
    expect(@mq.queue_counts(lock)[:consumers]).to eq(0)
    expect_all_back
  end

  it "gives up a filter after its time, says how far it read, holds at most 1,000, and loses none" do
    fill(SAFETY_DEEP)
    held = []
    watcher = Thread.new do
      ch = @bunny.create_channel
      # The broker's own count of what the reader holds, every 50 ms.
      while Thread.current[:go] != false
        held << (ch.queue_declare(dlq, passive: true, durable: true, arguments: { "x-queue-type" => "quorum" }).message_count rescue nil) # rubocop:disable Style/RescueModifier
        sleep 0.05
      end
      ch.close
    end
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    r = @mq.browse_dead_letters(queue, reason: "no reason like this", within: 2)
    took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    watcher[:go] = false
    watcher.join
    expect(r).to have_attributes(total: SAFETY_DEEP, gave_up: true, partial: true, dead_letters: [])
    expect(r.scanned).to be_between(1, SAFETY_DEEP - 1)
    expect(r.most_held).to be_between(1, 1_000)
    # Ready never fell by more than what one read may hold.
    expect(held.compact.min).to be >= SAFETY_DEEP - 1_000
    expect(took).to be < 30 # it stopped (the filter asked for 2 s)
    expect_all_back
    # The copies put back at the tail are the same letters: the head now
    # starts where the read left off, after the 800 it held and gave back.
    head = @mq.browse_dead_letters(queue, limit: 1, within: 10).dead_letters.first
    expect(head.id).to match(/\Adl-\d+\z/)
    expect(head.reason).to eq("declined #{head.id.delete_prefix('dl-')}")
  end
end
