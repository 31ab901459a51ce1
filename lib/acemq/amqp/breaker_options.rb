# frozen_string_literal: true

module AceMQ
  module AMQP
    # A consumer's circuit_breaker: { failures:, within:, pause:, probe:,
    # on:, ignore: } (docs/flow.md), checked once at consume, and the
    # question it asks of each handler's exception: does this failure say the
    # downstream is down?
    #
    # Only Ruby can ask an exception is_a? or call a Proc with it, so the
    # handler's thread asks (#counts?) and the engine is told the answer with
    # the settlement. The failures that are not exceptions (:retry, an
    # Ack.retry; :timeout, a handler past its deadline) the engine meets
    # itself, so they go to it as names, with the numbers (#native).
    class BreakerOptions
      KEYS = %i[failures within pause probe on ignore].freeze
      # Failures without an exception, named in on: and ignore:.
      KINDS = %i[retry timeout].freeze

      # nil for nil; else a BreakerOptions, or ConfigurationError saying
      # what it takes.
      def self.from(options)
        return nil if options.nil?
        return options if options.is_a?(BreakerOptions)

        o = options.is_a?(Hash) ? options.transform_keys(&:to_sym) : {}
        missing = %i[failures within pause] - o.keys
        unless missing.empty? && (o.keys - KEYS).empty?
          raise ConfigurationError, "circuit_breaker takes failures:, within: and pause: (seconds), and optionally probe: " \
                                    "(seconds), on: and ignore: (exception classes, callables taking the error, :retry, " \
                                    ":timeout), e.g. { failures: 10, within: 30, pause: 60, on: [Net::ReadTimeout] } " \
                                    "(got #{options.inspect})"
        end
        new(**o)
      end

      attr_reader :failures, :within, :pause, :probe, :on, :ignore

      def initialize(failures:, within:, pause:, probe: nil, on: nil, ignore: nil)
        @failures = Integer(failures, exception: false)
        @within = Float(within, exception: false)
        @pause = Float(pause, exception: false)
        @probe = probe.nil? ? nil : Float(probe, exception: false)
        if [@failures, @within, @pause].include?(nil) || (!probe.nil? && @probe.nil?)
          raise ConfigurationError, "circuit_breaker: failures is a whole number, within, pause and probe seconds " \
                                    "(got failures #{failures.inspect}, within #{within.inspect}, pause #{pause.inspect}, " \
                                    "probe #{probe.inspect})"
        end
        # 2.5 failures is not a count (Integer would make it 2); 2**70 does
        # not cross into the engine (a RangeError from the conversion).
        unless @failures.between?(-2**62, 2**62) && (!failures.is_a?(Float) || failures == @failures)
          raise ConfigurationError, "circuit_breaker: failures is how many failures within `within` open it: " \
                                    "1 to #{2**32 - 1} (got #{failures.inspect})"
        end
        # Core's rules, once, as given: the ones consume would refuse it by.
        AMQP._check_breaker(@failures, @within, @pause, @probe)
        @on = on.nil? ? nil : matchers(:on, on)
        @ignore = ignore.nil? ? nil : matchers(:ignore, ignore)
        freeze
      end

      # Whether `error` (a handler's StandardError) counts toward opening
      # the breaker: not when an ignore: matcher matches it; else, with on:,
      # when one of its matchers does; without, always. nil when neither was
      # given (the engine counts every failure, as it always has). A class
      # matches its subclasses (is_a?); a callable is called with the error.
      # A callable that raises counts the failure: a matcher with a bug must
      # not send an outage's messages to the DLQ. The caller hears of it.
      def counts?(error)
        return nil if @on.nil? && @ignore.nil?
        return false if @ignore && match?(@ignore, error)

        @on.nil? || match?(@on, error)
      end

      # What the engine takes: [failures, within, pause, probe or nil, the
      # kinds on: names (nil without on:), the kinds ignore: names].
      def native
        [@failures, @within, @pause, @probe, @on && kinds(@on), @ignore ? kinds(@ignore) : []]
      end

      # As given, for a consumer class's settings: the numbers, and what
      # else was given.
      def to_h
        { failures: @failures, within: @within, pause: @pause, probe: @probe, on: @on, ignore: @ignore }.compact
      end

      private

      def matchers(name, value)
        list = value.is_a?(Array) ? value : [value]
        list.each do |m|
          next if m.is_a?(Module) || KINDS.include?(m) || (!m.is_a?(Symbol) && m.respond_to?(:call))

          raise ConfigurationError, "circuit_breaker #{name}: takes exception classes (or modules), callables taking " \
                                    "the error, :retry and :timeout (got #{m.inspect})"
        end
        list.dup.freeze
      end

      def kinds(list) = list.select { |m| m.is_a?(Symbol) }.map(&:to_s)

      def match?(list, error)
        list.any? do |m|
          case m
          when Module then error.is_a?(m)
          when Symbol then false # :retry and :timeout are not exceptions
          else m.call(error) ? true : false
          end
        end
      end
    end
  end
end
