# frozen_string_literal: true

require "json"
require "time"
require "uri"
require "acemq/status/prometheus"
require "acemq/status/rabbitmqctl"

module AceMQ
  # What `acemq status` shows: for each consumer, its queue, its rung queues
  # and its DLQ as the broker has them now, the outbox backlog, and what the
  # runner's metrics say about the rate and the duplicates.
  #
  #   status = AceMQ::Status.new(connection: mq, targets: AceMQ::Status.targets_for(consumers))
  #   puts status.collect.then { |snapshot| AceMQ::Status.render(snapshot) }
  #
  # Where each number comes from (docs/observability.md says the same for
  # the operator):
  # - ready and consumers: a passive queue declare, on any broker.
  # - unacked: `rabbitmqctl list_queues` when the broker is on this machine
  #   (or rabbitmqctl: names a command); "—" otherwise, because AMQP has no
  #   such count and the management plugin may not be enabled.
  # - change/s: two passive declares interval seconds apart; how fast the
  #   ready count grows (consumers falling behind) or shrinks.
  # - done/s and duplicates: the runner's consumed counter at its /metrics,
  #   scraped at both samples; absent when no runner answers there.
  class Status
    # A queue to look at: the consumer's name (nil for --queue), its queue,
    # its rung queues and its DLQ.
    Target = Struct.new(:name, :queue, :rungs, :dlq, keyword_init: true)

    # Dead letters read to find the newest reasons: peeking reads them in
    # order, so the newest of a deep DLQ costs reading the ones before it.
    PEEK_LIMIT = 200
    NEWEST = 3

    def self.targets_for(consumer_classes)
      consumer_classes.map do |klass|
        policy = klass.retries || AMQP::RetryPolicy.new
        target(klass.queue_name, name: klass.name, policy: policy)
      end
    end

    def self.target(queue, name: nil, policy: AMQP::RetryPolicy.new)
      Target.new(name: name, queue: queue,
                 rungs: AMQP._rung_queues(queue, policy.max_attempts, policy.initial_delay, policy.max_delay),
                 dlq: "#{queue}.dlq")
    end

    # connection: an open AceMQ::AMQP::Connection; outbox: a store with
    # #backlog (or nil); metrics_url: the runner's /metrics (or nil);
    # rabbitmqctl: a Rabbitmqctl (or nil for none).
    def initialize(connection:, targets:, broker: nil, outbox: nil, metrics_url: nil, rabbitmqctl: nil, interval: 1.0)
      @mq = connection
      @targets = targets
      @broker = broker
      @outbox = outbox
      @metrics_url = metrics_url
      @ctl = rabbitmqctl
      @interval = Float(interval)
    end

    # A snapshot: a Hash of plain values (what --json prints).
    def collect
      ctl = @ctl && Thread.new { listing } # slow (a second or two): runs while the interval passes
      first_metrics = scrape
      first = counts
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      sleep(@interval) if @interval.positive?
      second = counts
      second_metrics = scrape
      elapsed = [Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0, 0.001].max
      listed, ctl_error = ctl ? ctl.value : [nil, nil]
      metrics_error = [first_metrics, second_metrics].find { |m| m.is_a?(String) }
      {
        at: Time.now.utc.iso8601,
        broker: @broker,
        interval: elapsed.round(2),
        unacked_from: listed ? @ctl.to_s : nil,
        unacked_error: ctl_error,
        metrics_url: @metrics_url,
        metrics_error: metrics_error || (@metrics_url ? nil : "no metrics URL"),
        consumers: @targets.map do |t|
          consumer(t, first, second, listed, elapsed, metrics_error ? nil : [first_metrics, second_metrics])
        end,
        outbox: outbox,
        delayed: delayed
      }
    end

    # One pass, with no interval and no DLQ read: each consumer's queue,
    # rungs and DLQ counts and the runner's consumed totals (consumed_total
    # by outcome) now, the outbox, and what waits in the delay cascade. AceMQ::Web's overview refreshes from
    # this every 2 s, keeps the samples, and takes its rates from them.
    # counts: { name => { ready:, consumers: } } already fetched (the
    # management API's listing, or asked in parallel), instead of the
    # passive declares; delayed: the delay cascade's levels already
    # fetched, instead of asking.
    def sample(listed = nil, counts: nil, delayed: nil)
      metrics = scrape
      now = counts || self.counts
      {
        at: Time.now.utc.iso8601,
        metrics_error: metrics.is_a?(String) ? metrics : nil,
        consumers: @targets.map do |t|
          queue = row(t.queue, now, listed)
          consumed = !metrics.is_a?(String) && Prometheus.consumed(metrics, t.queue)
          queue[:consumed_total] = consumed.transform_values(&:to_i) if consumed
          { name: t.name, queue: queue, rungs: t.rungs.map { |r| row(r, now, listed) }, dlq: row(t.dlq, now, listed) }
        end,
        outbox: outbox,
        delayed: delayed || self.delayed
      }
    end

    # The passive declares of every target's queues, their rungs and DLQs.
    def queue_names = @targets.flat_map { |t| [t.queue, *t.rungs, t.dlq] }

    private

    def consumer(target, first, second, listed, elapsed, metrics)
      queue = row(target.queue, second, listed)
      if queue[:exists] && first[target.queue]
        queue[:ready_change_per_s] = ((second[target.queue][:ready] - first[target.queue][:ready]) / elapsed).round(1)
      end
      queue.merge!(rates(target.queue, metrics, elapsed)) if metrics
      # Paused is not dead: a paused consumer has no broker consumer (CONS 0).
      queue[:paused] = Prometheus.flag(metrics.last, "acemq_consumer_paused", target.queue) if metrics
      queue[:circuit_open] = Prometheus.flag(metrics.last, "acemq_circuit_open", target.queue) if metrics
      dlq = row(target.dlq, second, listed)
      dlq[:newest] = dlq[:exists] && dlq[:ready].to_i.positive? ? newest(target.queue, dlq[:ready]) : []
      { name: target.name, queue: queue, rungs: target.rungs.map { |r| row(r, second, listed) }, dlq: dlq }
    end

    def row(name, sample, listed)
      counts = sample[name]
      return { name: name, exists: false } unless counts

      unacked = listed&.dig(name, :unacked)
      { name: name, exists: true, ready: counts[:ready], unacked: unacked, consumers: counts[:consumers] }
    end

    def counts
      @mq.queue_counts_many(queue_names).compact
    end

    def listing
      [@ctl.list_queues, nil]
    rescue Rabbitmqctl::Unavailable => e
      [nil, "#{@ctl}: #{e.message}"]
    end

    # The samples, or the reason there are none (a String).
    def scrape
      return "no metrics URL" unless @metrics_url

      samples = Prometheus.scrape(@metrics_url)
      return "no #{Prometheus::CONSUMED} in it" unless samples.any? { |s| s.name == Prometheus::CONSUMED }

      samples
    rescue Prometheus::Unavailable => e
      e.message
    end

    def rates(queue, (before, after), elapsed)
      a = Prometheus.consumed(before, queue) || {}
      b = Prometheus.consumed(after, queue) || {}
      done = b.values.sum - a.values.sum
      dup = Prometheus::NOT_FIRST_TIME.sum { |o| b[o] - a[o] }
      { done_per_s: (done / elapsed).round(1), duplicates_per_s: (dup / elapsed).round(1),
        duplicate_ratio: done.positive? ? (dup / done).round(3) : nil,
        consumed_total: b.transform_values(&:to_i) }
    end

    def newest(queue, depth)
      @mq.peek_dead_letters(queue, limit: [[depth, PEEK_LIMIT].min, 1].max).last(NEWEST).reverse.map do |d|
        # The backtrace is in --json only: the text keeps to 80 columns, one
        # line a letter.
        { id: d.id, type: d.type, attempt: d.attempt, reason: d.reason, error_class: d.error_class,
          backtrace: d.backtrace, failed_at: d.failed_at&.utc&.iso8601 }
      end
    end

    # The delay cascade's levels holding messages (Connection#delayed), as
    # Hashes: the snapshot is a document (--json, the dashboard's /status).
    def delayed
      @mq.delayed.map(&:to_h)
    rescue AMQP::Error => e
      { error: "#{e.class}: #{e.message}" }
    end

    def outbox
      return nil unless @outbox

      # to_h: an OutboxBacklog, or the Hash an outbox of the application's
      # own (anything with a backlog) may still give.
      b = @outbox.backlog.to_h
      { table: @outbox.respond_to?(:table) ? @outbox.table : nil, waiting: b[:count],
        oldest_age: b[:oldest_age]&.round(1), failing: b[:stuck] }
    rescue StandardError => e
      { error: "#{e.class}: #{e.message}" }
    end
  end
end

require "acemq/status/report"
