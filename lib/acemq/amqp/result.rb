# frozen_string_literal: true

module AceMQ
  module AMQP
    # What the operator's calls return (DeadLetters::Page, ReplayReport,
    # Delays::Level, Patterns::OutboxBacklog, ...): a frozen value with a
    # reader per field, to_h, ==, and pattern matching (deconstruct_keys).
    #
    #   class ReplayReport < Result
    #     fields :replayed, :skipped, as: "report",
    #            returned_by: "Connection#replay_dead_letters returns a DeadLetters::ReplayReport"
    #   end
    #
    # These calls returned Hashes up to 0.1.0; the Hash forms (report[:replayed],
    # fetch, dig, key?, slice, keys, values, each, map, == a Hash) still
    # answer, for one deprecation cycle, and each warns once per process per
    # class and method, naming the reader to use. They go in 0.2.
    #
    # Ruby classes rather than the engine's own (Connection::ReplayReport and
    # the rest, which the extension names): those carry the engine's units
    # (failed_at in seconds, outbox times in ms) and names (moved), and a
    # page's total, gave_up and most_held come beside it, not in it.
    class Result
      # Those that have warned, by [class, method]: once each per process.
      @warned = {}
      @lock = Mutex.new

      # Where the application asked: the first frame outside this library,
      # RSpec's matchers and forwardable (one warning a process, so it must
      # name the caller's line, not the matcher's).
      PASSED_OVER = %r{/lib/acemq/|/rspec[-/]|/forwardable\.rb|<internal:}.freeze

      def self.callers_line
        loc = caller_locations(2).find { |l| !l.path.to_s.match?(PASSED_OVER) } || caller_locations(2, 1).first
        "#{loc.path}:#{loc.lineno}"
      end

      # True the first time key is asked in this process (Result's own
      # table, whichever subclass asks). Not for applications: undocumented.
      def self.first_warning?(key) = @lock.synchronize { !@warned.key?(key) && (@warned[key] = true) }

      class << self
        # The fields (readers, in to_h's order), what returns it (the
        # warning's first words), and the variable its examples read it by.
        attr_reader :members, :returned_by, :as

        def fields(*names, returned_by:, as:)
          @members = names.freeze
          @returned_by = returned_by
          @as = as
          attr_reader(*names)
        end

        # Warn once per process for method on this class (whichever key it
        # was asked first), at the caller of the Hash form (uplevel 3: past
        # this, Result#deprecated and the form).
        def deprecated(method, form, instead)
          return unless Result.first_warning?([self, method])

          also = instead.start_with?("#{as}.to_h") ? "" : " (or #{as}.to_h)"
          warn("#{Result.callers_line}: warning: acemq: #{returned_by} now; #{form} is deprecated and goes in 0.2: " \
               "read #{instead}#{also}")
        end
      end

      # Every field by name, none missing and none more. Strings, Arrays and
      # Hashes are frozen with it: they are the caller's copies, never the
      # engine's.
      def initialize(**values)
        missing = self.class.members - values.keys
        extra = values.keys - self.class.members
        raise ArgumentError, "#{self.class.name}: missing #{missing.join(', ')}" unless missing.empty?
        raise ArgumentError, "#{self.class.name}: unknown #{extra.join(', ')}" unless extra.empty?

        values.each do |k, v|
          # Not a Time: Time#utc and #localtime change it in place, and
          # every caller's row.failed_at.utc would raise FrozenError.
          v.freeze if v.is_a?(String) || v.is_a?(Array) || v.is_a?(Hash)
          instance_variable_set(:"@#{k}", v)
        end
        freeze
      end

      # The Hash these calls returned before (a Result inside, as the
      # letters of a page, becomes its Hash too). Not deprecated.
      def to_h
        self.class.members.to_h do |k|
          v = public_send(k)
          [k, v.is_a?(Array) ? v.map { |e| e.is_a?(Result) ? e.to_h : e } : v]
        end
      end

      def deconstruct_keys(_keys) = to_h

      # JSON of to_h. A String that is not UTF-8 (a dead letter's body is the
      # bytes as they arrived) cannot be JSON text: it goes as
      # { "base64" => ... } instead of raising for the whole page.
      def to_json(*args) = Result.jsonable(to_h).to_json(*args)

      def self.jsonable(value)
        case value
        when Hash then value.transform_values { |v| jsonable(v) }
        when Array then value.map { |v| jsonable(v) }
        when String
          text = value.encoding == Encoding::BINARY ? value.dup.force_encoding(Encoding::UTF_8) : value
          text.valid_encoding? ? text : { "base64" => [value].pack("m0") }
        else value
        end
      end

      # Equal to a Result of the same class and fields; equal to a Hash
      # (the deprecated form) that to_h equals.
      def ==(other)
        return other.class == self.class && other.to_h == to_h unless other.is_a?(Hash)

        deprecated(:==, "#{as} == {...}", "#{as}.to_h == {...}")
        to_h == other
      end

      def eql?(other) = other.class == self.class && other.to_h.eql?(to_h)
      def hash = [self.class, to_h].hash

      # Fields as name=value; a list of Results as how many, not each.
      def inspect
        shown = self.class.members.map do |k|
          v = public_send(k)
          "#{k}=#{v.is_a?(Array) && v.first.is_a?(Result) ? "[#{v.size} #{v.first.class.name.split('::').last}]" : v.inspect}"
        end
        "#<#{self.class.name} #{shown.join(' ')}>"
      end
      alias to_s inspect

      # The Hash forms, deprecated. A key that is a field answers the
      # field's reader (a Result inside stays one, and its own Hash forms
      # answer); any other key, what the Hash would have: nil, or fetch's
      # KeyError.

      def [](key)
        deprecated(:[], "#{as}[#{key.inspect}]", reader(key))
        field(key)
      end

      def fetch(key, *default, &block)
        deprecated(:fetch, "#{as}.fetch(#{key.inspect})", reader(key))
        return field(key) if member?(key)

        {}.fetch(key, *default, &block)
      end

      def dig(key, *rest)
        deprecated(:dig, "#{as}.dig(#{key.inspect}, ...)", reader(key))
        value = field(key)
        # Deeper through the Hashes (to_h's), so a letter inside a page does
        # not warn a second time, from here.
        rest.empty? || value.nil? ? value : to_h[key].dig(*rest)
      end

      def key?(key)
        deprecated(:key?, "#{as}.key?(#{key.inspect})", "#{self.class.name}.members")
        member?(key)
      end
      alias has_key? key?

      def slice(*keys)
        deprecated(:slice, "#{as}.slice(...)", "#{as}.to_h.slice(...)")
        to_h.slice(*keys)
      end

      def keys
        deprecated(:keys, "#{as}.keys", "#{self.class.name}.members")
        self.class.members.dup
      end

      def values
        deprecated(:values, "#{as}.values", "#{as}.to_h.values")
        self.class.members.map { |k| public_send(k) }
      end

      def each(&block)
        deprecated(:each, "#{as}.each", "#{as}.to_h.each")
        return enum_for(:each) unless block

        self.class.members.each { |k| yield(k, public_send(k)) }
        self
      end
      alias each_pair each

      def map(&block)
        deprecated(:map, "#{as}.map", "#{as}.to_h.map")
        return enum_for(:map) unless block

        self.class.members.map { |k| yield(k, public_send(k)) }
      end

      # Any other method a Hash has (to_a, any?, size, merge, select, ...):
      # deprecated too, warned once like the rest, and answered from to_h.
      def method_missing(name, *args, &block)
        return super unless Hash.public_method_defined?(name)

        deprecated(name, "#{as}.#{name}", "#{as}.to_h.#{name}")
        to_h.public_send(name, *args, &block)
      end

      def respond_to_missing?(name, include_private = false) = Hash.public_method_defined?(name) || super

      private

      def as = self.class.as
      def member?(key) = key.is_a?(Symbol) && self.class.members.include?(key)
      def field(key) = member?(key) ? public_send(key) : nil
      def reader(key) = member?(key) ? "#{as}.#{key}" : "#{as}.to_h"
      def deprecated(method, form, instead) = self.class.deprecated(method, form, instead)
    end
  end
end
