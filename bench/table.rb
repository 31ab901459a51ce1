# frozen_string_literal: true

# Prints the rows bench/*.rb recorded this run (bench/common.rb, Table), in
# one Markdown table: what `rake bench` ends with, and what bench/README.md
# quotes.
require "json"

file = ENV.fetch("ACEMQ_BENCH_ROWS", File.expand_path("../tmp/bench/rows.jsonl", __dir__))
rows = File.exist?(file) ? File.readlines(file).map { |l| JSON.parse(l) } : []
abort "bench/table.rb: no rows in #{file}" if rows.empty?

puts
puts "| path | result | target | pass |"
puts "|---|---:|---:|---|"
rows.each { |r| puts "| #{r['path']} | #{r['result']} | #{r['target']} | #{r['pass'] ? 'pass' : 'MISS'} |" }
misses = rows.reject { |r| r["pass"] }
puts
puts "#{rows.size - misses.size} of #{rows.size} targets met."
misses.each { |r| puts "- #{r['path']}: #{r['bound']}" if r["bound"] }
