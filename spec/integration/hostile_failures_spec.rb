# frozen_string_literal: true

# What a handler's failure can be made of, from the hostile run of issue 49
# part 2, on memory:// and RabbitMQ. Each of these ended the handler thread
# inside the settlement before: an exception whose message is nil, raises or
# is an Integer, or whose class's name raises (a TypeError in the engine's
# reading of it); an Ack.reject whose reason is binary text ("café".b, as an
# HTTP body is) or invalid UTF-8 (an EncodingError); a breaker matcher that
# raised SystemStackError (the thread ended with its delivery held and no
# thread in its place). The failure was then a HandlerAborted without its
# class or message, a reject ran three times, and the breaker never opened
# on an error its on: named. Each hostile one sits between two good ones.
class HostileNilMessage < IOError
  def message = nil
end

class HostileRaisingMessage < StandardError
  def message = raise(ArgumentError, "no message for you")
end

class HostileIntegerMessage < StandardError
  def message = 42
end

class HostileRaisingName < StandardError
  def self.name = raise(NotImplementedError, "no name for you")
end

RSpec.describe "hostile failures in a handler" do
  [["memory://", "memory"], [AMQP_URL, "rabbitmq"]].each do |url, label|
    context "on #{label}" do
      let(:queue) { unique("hostile-fail") }
      let(:mq) { AceMQ::AMQP::Connection.open(url, origin: unique("hostile-fail-spec")) }

      before { AceMQ::AMQP::Topology.new.queue(queue).apply(mq) }
      after { mq.close }

      def letters = mq.peek_dead_letters(queue, limit: 50)

      # n items of q once it has them (Ruby 3.1's Queue#pop has no timeout:).
      def take(q, n)
        eventually(timeout: 20) { q.size >= n }
        Array.new(n) { q.pop }
      end

      it "keeps the class and message of an exception whatever its message or name does" do
        failures = { "nil" => HostileNilMessage, "raises" => HostileRaisingMessage, "int" => HostileIntegerMessage,
                     "name" => HostileRaisingName }
        seen = Queue.new
        errors = Queue.new
        sub = mq.consume(queue, retries: { max_attempts: 1 }, on_error: ->(e) { errors << e }) do |m|
          seen << m.payload["n"]
          klass = failures[m.payload["n"]]
          raise klass if klass

          AceMQ::AMQP::Ack.accept
        end
        names = failures.keys.flat_map { |k| ["good-#{k}-1", k, "good-#{k}-2"] }
        names.each { |n| mq.publish({ "n" => n }, to: queue) }
        eventually(timeout: 20) { letters.size == failures.size }
        by_id = letters.to_h { |l| [JSON.parse(l.body)["n"], l] }
        expect(by_id.transform_values(&:error_class))
          .to eq("nil" => "HostileNilMessage", "raises" => "HostileRaisingMessage", "int" => "HostileIntegerMessage",
                 "name" => "HostileRaisingName")
        expect(by_id["raises"].reason).to include("its message raised")
        expect(by_id["int"].reason).to include("42")
        expect(by_id.values.map { |l| l.backtrace.to_s.lines.first }).to all(include("hostile_failures_spec.rb"))
        drained = take(seen, names.size)
        expect(drained.sort).to eq(names.sort) # each once: no HandlerAborted retry
        expect(sub.stats).to include(accepted: failures.size * 2, dead_lettered: failures.size)
        aborted = Array.new(errors.size) { errors.pop }.grep(AceMQ::AMQP::HandlerAborted)
        expect(aborted).to eq([])
        sub.cancel
      end

      it "rejects with a reason in binary or invalid UTF-8 once, reason kept as text" do
        calls = Hash.new(0)
        reasons = { "bin" => "no such café".b, "bad" => "no \xFF".b.force_encoding(Encoding::UTF_8) }
        sub = mq.consume(queue, retries: { max_attempts: 3, initial_delay: 0.1 }) do |m|
          n = m.payload["n"]
          calls[n] += 1
          reasons[n] ? AceMQ::AMQP::Ack.reject(reasons[n]) : AceMQ::AMQP::Ack.accept
        end
        %w[good-1 bin good-2 bad good-3].each { |n| mq.publish({ "n" => n }, to: queue) }
        eventually(timeout: 20) { letters.size == 2 && calls.values.sum == 5 }
        by_id = letters.to_h { |l| [JSON.parse(l.body)["n"], l.reason] }
        expect(by_id["bin"]).to eq("no such café")
        expect(by_id["bad"]).to eq("no \uFFFD")
        expect(calls).to eq("good-1" => 1, "bin" => 1, "good-2" => 1, "bad" => 1, "good-3" => 1)
        sub.cancel
      end

      it "counts a failure whose breaker matcher raised an Exception, tells on_error, and keeps its threads" do
        errors = Queue.new
        handled = Queue.new
        deep = ->(e) { deep.call(e) } # SystemStackError, not a StandardError
        sub = mq.consume(queue, concurrency: 2, retries: { max_attempts: 1 }, on_error: ->(e) { errors << e },
                                circuit_breaker: { failures: 100, within: 60, pause: 60, on: [deep] }) do |m|
          raise IOError, "downstream" if m.payload["n"].start_with?("bad")

          handled << m.payload["n"]
          AceMQ::AMQP::Ack.accept
        end
        names = %w[good-1 bad-1 good-2 bad-2 good-3]
        names.each { |n| mq.publish({ "n" => n }, to: queue) }
        got = take(handled, 3)
        expect(got.sort).to eq(%w[good-1 good-2 good-3])
        eventually(timeout: 20) { letters.size == 2 }
        reported = Array.new(errors.size) { errors.pop }
        expect(reported.grep(AceMQ::AMQP::ConfigurationError).map(&:message)).to all(include("SystemStackError"))
        expect(reported.grep(AceMQ::AMQP::HandlerAborted)).to eq([])
        expect(sub.alive?).to be(true)
        mq.publish({ "n" => "good-4" }, to: queue)
        expect(take(handled, 1)).to eq(["good-4"])
        sub.cancel
      end
    end
  end

  it "refuses failures: that is not a whole number the engine can count, with ConfigurationError" do
    mq = AceMQ::AMQP::Connection.open("memory://")
    AceMQ::AMQP::Topology.new.queue("q").apply(mq)
    [-1, 0, 2**70, 1.5].each do |bad|
      expect { mq.consume("q", circuit_breaker: { failures: bad, within: 1, pause: 1 }) { AceMQ::AMQP::Ack.accept } }
        .to raise_error(AceMQ::AMQP::ConfigurationError, /failures/)
    end
  ensure
    mq&.close
  end
end
