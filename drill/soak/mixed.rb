# frozen_string_literal: true

require_relative "transport"

module Soak
  # The long mode's second half: every path at once, in turns, with good
  # traffic between, for `minutes`, on the connection the paths ran on.
  # Resources are printed at the start, at 10 minutes (halfway in a run
  # shorter than 20) and at the end; judged against the start once every
  # path has stopped, and RSS between the 10-minute mark and the end
  # (allocators grow to a plateau first; a leak keeps climbing).
  class Mixed
    # Operations of each path per turn: about as long a turn each.
    TURN = Hash.new(20).merge("consumer_deleted" => 1, "reconnect" => 2, "request_timeout" => 5,
                              "handler_overruns" => 4, "oversized" => 5).freeze
    RSS_DRIFT_MB = 20

    attr_reader :failures, :row

    def initialize(run, minutes)
      @run = run
      @minutes = minutes
      @failures = []
    end

    def call
      paths = PATHS.map { |k| k.new(@run.ctx, Float::INFINITY) }.reject(&:skip_reason)
      paths.each(&:prepare)
      before = @run.steady
      paths.each(&:start)
      t0 = Soak.now
      mark = [@minutes * 60 / 2.0, 600].min
      published = @run.good.published
      report("mixed start", @run.probe.sample)
      marked = nil
      i = 0
      until Soak.now - t0 > @minutes * 60
        paths.each do |p|
          TURN[p.class.key].times { p.attempt(i) }
          @run.good.publish
        end
        i += 1
        next if marked || Soak.now - t0 < mark

        marked = @run.probe.sample
        report(format("mixed at %.1f min", (Soak.now - t0) / 60), marked)
      end
      last = @run.probe.sample
      report(format("mixed end, %.1f min", (Soak.now - t0) / 60), last)
      paths.each(&:stop)
      after, settle = @run.probe.settle(before)
      Soak.say "#{@run.label}: mixed, every path stopped and settled (#{settle.round(1)}s): #{Soak.describe(after)} " \
               "(before: #{Soak.describe(before)})"
      paths.each { |p| judge(p) }
      Probe.excess(after, before).each do |k, (b, a)|
        @failures << "#{@run.label} mixed: #{k} grew from #{b} to #{a} (tolerance +#{TOLERANCE[k]})"
      end
      drift = last.rss_mb - (marked || before).rss_mb
      @failures << format("#{@run.label} mixed: RSS grew %.1f MB between the mark and the end (limit %d MB)", drift, RSS_DRIFT_MB) if drift > RSS_DRIFT_MB
      missing, = @run.good.account
      Soak.say "#{@run.label}: mixed: #{paths.sum(&:ops)} failing operations, #{@run.good.published - published} good " \
               "publishes, #{missing.size} good messages lost, " \
               "#{paths.grep(HandlerPath).sum { |p| p.failures.grep(/neither accepted/).size }} handler paths with messages lost"
      @failures.each { |f| Soak.say "    FAILED: #{f}" }
      paths.each do |p|
        p.cleanup
      rescue StandardError
        nil
      end
      self
    end

    private

    def report(what, s) = Soak.say("#{@run.label}: #{what}: #{Soak.describe(s)}")

    def judge(path)
      path.wrong.each do |label, text|
        @failures << "#{@run.label} mixed #{path.class.key}: #{path.counts[label]} × #{label} where #{path.expect.join(' or ')} " \
                     "was expected; first: #{text[0, 300]}"
      end
      path.failures.each { |f| @failures << "#{@run.label} mixed #{path.class.key}: #{f}" }
    end
  end
end
