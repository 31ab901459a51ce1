# frozen_string_literal: true

require "json"
require "acemq/amqp"
require "acemq/testing/harness"
require "acemq/testing/published"

module AceMQ
  module Testing
    # What was published, asked the way both kits ask it: RSpec's
    # have_published is this with RSpec's matcher protocol on top
    # (AceMQ::RSpec::HavePublished), Minitest's assert_published and
    # refute_published build one from their keywords. So the two kits match
    # the same publishes, count them the same way and fail with the same
    # message.
    #
    # Expected values are compared as RSpec compares them: a value with ===
    # (a Regexp, a Class, a Range, a lambda, an RSpec matcher) or ==, Hashes
    # and Arrays element by element.
    class PublishExpectation
      ANY = Object.new.freeze

      # Shown when the actual publishes are many: the first ones are enough
      # to see what went wrong.
      SHOWN = 10

      COUNTS = { once: 1, twice: 2, thrice: 3 }.freeze

      def initialize(payload = ANY)
        @payload = payload
        @to = ANY
        @exchange = nil
        @type = ANY
        @headers = nil
        @count = [:exactly, 1]
        @counted = false
      end

      # Where, as publish(to:, exchange:) says it: without .on, the queue
      # the message was published to through the default exchange; with it,
      # the routing key.
      def to(name)
        @to = name
        self
      end

      # The exchange (and, without .to, any routing key on it).
      def on(exchange)
        @exchange = exchange.to_s
        self
      end

      def with_type(type)
        @type = type
        self
      end

      # Headers the message carries, among others (values may be matchers).
      def with_headers(headers)
        @headers = headers.transform_keys(&:to_s)
        self
      end

      def exactly(count) = counting(:exactly, count)
      def at_least(count) = counting(:at_least, count)
      def at_most(count) = counting(:at_most, count)
      def once = exactly(:once)
      def twice = exactly(:twice)
      def thrice = exactly(:thrice)
      def times = self
      alias time times

      def matches?(actual)
        @matching = publishes_of(actual).select { |p| !p.refused? && match?(p) }
        n = @matching.size
        case @count.first
        when :exactly then n == @count.last
        when :at_least then n >= @count.last
        when :at_most then n <= @count.last
        end
      end

      def does_not_match?(actual)
        raise AMQP::ConfigurationError, ambiguous_negation if @counted

        matches?(actual)
        @matching.empty?
      end

      def description
        "publish #{count_text} #{where_text}#{type_text}#{payload_text}#{headers_text}".squeeze(" ").strip
      end

      def failure_message
        "expected #{subject_text} to #{description}, but it published it #{times_text(@matching.size)}.\n#{actual_text}"
      end

      def failure_message_when_negated
        "expected #{subject_text} not to #{description.sub(/\Apublish #{Regexp.escape(count_text)}/, 'publish')}, " \
          "but it published it #{times_text(@matching.size)}.\n#{actual_text}"
      end

      # The publishes that matched, after matches? or does_not_match?.
      def matching = @matching || []

      # RSpec's composable matchers (hash_including, a_string_matching) and
      # plain values alike: ===, ==, or element by element.
      def values_match?(expected, actual)
        if expected.is_a?(Hash) && actual.is_a?(Hash)
          return false unless expected.size == actual.size

          expected.all? { |k, v| actual.key?(k) && values_match?(v, actual[k]) }
        elsif expected.is_a?(Array) && actual.is_a?(Array)
          expected.size == actual.size && expected.zip(actual).all? { |e, a| values_match?(e, a) }
        else
          # === first and rescued: a lambda that expects a Hash, handed a
          # String payload, is a non-match and not an error in the test.
          begin
            return true if expected === actual # rubocop:disable Style/CaseEquality
          rescue StandardError
            return false
          end
          expected == actual
        end
      end

      # What an expected value is called in a failure message.
      def description_of(value)
        if value.respond_to?(:description) && value.respond_to?(:matches?) then value.description
        elsif value.is_a?(Proc) then "matching the #{value.lambda? ? 'lambda' : 'proc'} at #{value.source_location&.join(':')}"
        else value.inspect
        end
      end

      private

      def ambiguous_negation
        "a refuted publish with a count (#{@count.first} #{@count.last}) is ambiguous: " \
          "assert it was published exactly 0 times, or leave the count out"
      end

      def counting(kind, count)
        count = COUNTS.fetch(count) { Integer(count) }
        raise AMQP::ConfigurationError, "a publish count is zero or more, got #{count}" if count.negative?

        @count = [kind, count]
        @counted = true
        self
      end

      # A block: what the kit's publisher recorded while it ran. A value:
      # a RecordingPublisher (acemq_publisher), or publishes (acemq_published).
      def publishes_of(actual)
        @block = actual.is_a?(Proc)
        @all =
          if @block
            publisher = Harness.current!.publisher
            from = publisher.size
            actual.call
            publisher.since(from)
          elsif actual.respond_to?(:since)
            actual.since(0)
          elsif actual.is_a?(Array) && actual.all?(Published)
            actual
          else
            raise AMQP::ConfigurationError,
                  "a publish is looked for in a block, acemq_publisher or acemq_published, got #{actual.inspect}"
          end
      end

      def match?(published)
        exchange = @exchange || (@to.equal?(ANY) ? nil : "")
        return false if exchange && published.exchange != exchange
        return false unless @to.equal?(ANY) || values_match?(@to, published.to)
        return false unless @type.equal?(ANY) || values_match?(@type, published.type)
        return false if @headers && !headers_match?(published.headers)

        payload_match?(published)
      end

      def headers_match?(headers)
        @headers.all? { |k, v| headers.key?(k) && values_match?(v, headers[k]) }
      end

      # The payload as the code gave it, or as a consumer will receive it
      # (string keys, a Time as its string): a spec may say either. Plain
      # data in the expectation is put through JSON too, so `order_id: 1`
      # matches what arrives as "order_id" => 1.
      def payload_match?(published)
        return true if @payload.equal?(ANY)
        return true if values_match?(@payload, published.sent) || values_match?(@payload, published.payload)

        plain?(@payload) && JSON.parse(JSON.generate(@payload)) == published.payload
      end

      def plain?(value)
        case value
        when Hash then value.all? { |k, v| (k.is_a?(String) || k.is_a?(Symbol)) && plain?(v) }
        when Array then value.all? { |v| plain?(v) }
        when String, Symbol, Numeric, true, false, nil then true
        else false
        end
      end

      def subject_text = @block ? "the block" : "the publisher"

      def count_text
        kind, n = @count
        return times_text(n) if kind == :exactly

        "#{kind.to_s.tr('_', ' ')} #{times_text(n)}"
      end

      def times_text(n)
        { 1 => "once", 2 => "twice" }.fetch(n) { "#{n} times" }
      end

      def where_text
        to = @to.equal?(ANY) ? nil : description_of(@to)
        if @exchange
          to ? "on #{@exchange.inspect} with routing key #{to}" : "on #{@exchange.inspect}"
        else
          to ? "to #{to}" : "anything"
        end
      end

      def type_text = @type.equal?(ANY) ? "" : " with type #{description_of(@type)}"
      def payload_text = @payload.equal?(ANY) ? "" : " with payload #{description_of(@payload)}"
      def headers_text = @headers ? " with headers #{description_of(@headers)}" : ""

      def actual_text
        published = @all.reject(&:refused?)
        refused = @all.select(&:refused?)
        text = +(published.empty? ? "Nothing was published." : "Published (#{published.size}):\n#{list(published)}")
        text << "\nRefused, so not published (#{refused.size}):\n#{list(refused)}" unless refused.empty?
        text
      end

      def list(publishes)
        lines = publishes.first(SHOWN).map { |p| "  #{p.inspect}" }
        lines << "  ... and #{publishes.size - SHOWN} more" if publishes.size > SHOWN
        lines.join("\n")
      end
    end
  end
end
