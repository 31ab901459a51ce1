# frozen_string_literal: true

# What the probes share: a Bunny connection to the URL they are given, the
# queues they make (deleted by `cleanup`, which each calls in its ensure),
# and the one-liners they read messages with. Bunny, not AceMQ: a probe
# measures the broker, and must not depend on what it is measuring for.
require "bunny"
require "logger"
require "securerandom"

URL = ARGV[0] || "amqp://guest:guest@127.0.0.1:5672"
$b = Bunny.new(URL, logger: Logger.new(nil)).tap(&:start)
puts "server: #{$b.server_properties["version"]}"
$made = []

def ch = $b.create_channel
def q!(name, args) = (c = ch; c.queue(name, durable: true, arguments: args); $made << name; c.close)
def hdr(p) = (p.is_a?(Hash) ? p[:headers] : p.headers) || {}
def depth(q) = (c = ch; n = c.queue(q, passive: true).message_count; c.close; n)
def get(c, q) = (40.times { d, p, = c.basic_get(q, manual_ack: true); return [d, p] if d; sleep 0.05 }; nil)
def cleanup = (c = ch; $made.each { |n| c.queue_delete(n) rescue (c = ch) }; $b.close)
