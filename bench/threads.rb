# frozen_string_literal: true

# Where a Ruby consumer's CPU goes, thread by thread: the handler thread
# (named after its queue), lapin's I/O thread and the engine's runtime
# (acemq-io). N preloaded 1 KiB messages, prefetch 100, the handler reads
# payload["order_id"] and accepts, as bench/run.rb's consume case; for each
# run, each thread's CPU (user + system, from /proc/self/task) and voluntary
# context switches per message, then the rate and the process's CPU per
# message, medians. Not part of `rake bench`: it explains a row of it.
#
#   ruby bench/threads.rb      # the extension must be built (rake compile)
#
# AMQP_URL, BENCH_RUNS (default 3), BENCH_SCALE (default 1: 20,000 messages).
# The Rust side's figures: BENCH_CASES=consume BENCH_SIDE=acemq
# target/release/examples/bench.

require_relative "common"

module ThreadsBench
  C = BenchCommon

  # CPU milliseconds and voluntary switches so far, by thread id and name.
  def self.threads
    Dir["/proc/self/task/*"].filter_map do |task|
      name, cpu = C.proc_cpu("#{task}/stat") || next
      switches = File.read("#{task}/status")[/^voluntary_ctxt_switches:\s+(\d+)/, 1].to_i
      [File.basename(task), name, cpu / 1000, switches]
    rescue Errno::ENOENT, Errno::ESRCH
      nil # a thread that ended while being read
    end
  end

  # Per message, by thread name, between two readings.
  def self.per_message(before, after, n, queue)
    was = before.to_h { |id, name, cpu, cs| [[id, name], [cpu, cs]] }
    by = Hash.new { |h, k| h[k] = [0.0, 0] }
    after.each do |id, name, cpu, cs|
      cpu0, cs0 = was.fetch([id, name], [0.0, 0])
      # The handler thread is named after its queue (cut to 15 bytes).
      sum = by[name.start_with?("acemq ") ? "handler thread" : name]
      sum[0] += cpu - cpu0
      sum[1] += cs - cs0
    end
    by.map { |name, (cpu, cs)| format("%s %.1f us / %.2f switches", name, cpu * 1000 / n, cs.to_f / n) }.join(", ")
  end

  def self.run
    mq = AceMQ::AMQP::Connection.open(C::URL, origin: "acemq-bench-threads")
    queue = "acemq-bench-threads-#{Process.pid}"
    AceMQ::AMQP::Topology.new.queue(queue).apply(mq)
    n = C.count(20_000)
    rates = []
    cpus = []
    Integer(ENV.fetch("BENCH_RUNS", "3")).times do
      (0...n).each_slice(2_000) { |s| mq.batch { |b| s.each { |i| b.publish(C::PAYLOADS[i % 64], to: queue) } } }
      GC.start
      latch = C::Latch.new(n)
      cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
      before = threads
      t = C.now
      sub = mq.consume(queue, prefetch: 100) do |m|
        m.payload["order_id"]
        latch.hit
        AceMQ::AMQP::Ack.accept
      end
      latch.wait(60)
      sub.cancel
      rates << n / (C.now - t)
      cpus << (Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu) / n * 1e6
      puts "  #{per_message(before, threads, n, queue)}"
    end
    puts format("ruby consume, %d messages: %.0f/s, %.1f us/msg of the process's CPU (medians of %d)",
                n, C.median(rates), C.median(cpus), rates.size)
  ensure
    mq&.close
    delete(C.queues_named(queue)) if queue
  end

  # The queue, its DLQ and the rungs consuming declared.
  def self.delete(queues)
    bunny = Bunny.new(C::URL, logger: Logger.new(nil))
    bunny.start
    C.delete_queues(bunny, bunny.create_channel, queues)
    bunny.close
  end
end

ThreadsBench.run if $PROGRAM_NAME == __FILE__
