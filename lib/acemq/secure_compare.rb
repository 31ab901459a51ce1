# frozen_string_literal: true

module AceMQ
  # Whether two tokens are the same bytes, compared without an early exit,
  # so the time taken says nothing of how much of a guess was right: the
  # dashboard's CSRF token (Web::Request#csrf_ok?) and the swarm's control
  # token (Swarm::Health). Strings of different lengths are unequal at once:
  # a token's length is no secret. The runner's own endpoint compares in
  # core (runner/health.rs, constant_time_eq), by the same rule.
  def self.secure_compare(given, expected)
    return false unless given.bytesize == expected.bytesize

    given.bytes.zip(expected.bytes).reduce(0) { |acc, (x, y)| acc | (x ^ y) }.zero?
  end
end
