# frozen_string_literal: true

# The spec files Ruby 3.4 (Debian experimental) can run in the sid stage,
# one a line. Debian builds its native gems for the default Ruby (3.3)
# only, so on 3.4 these do not load: sqlite3, pg and mysql2 (the SQL stores, the
# outbox, ActiveRecord), nokogiri (so Rails: actionpack needs it) and rbtree
# (so Bunny, through sorted_set). A file that names any of them, or runs the
# dummy Rails app or the docs' samples (which boot Rails), is left to 3.3,
# where the whole suite runs.
NEEDS_33 = Regexp.union(
  /require\s+"(?:sqlite3|pg|mysql2|bunny|rails|active_record|action_\w+|rspec\/rails)"/,
  # the drills' helpers load Bunny; so do the shared transport examples
  # (ready_on), RunnerHelpers#ready_count and the outbox helpers
  # (outbox_bunny, outbox_sqlite, outbox_pg, outbox_mysql); rspec-rails
  # needs Rails
  %r{drill/support|drill/node},
  /it_behaves_like "a transport"|\bready_count\b|outbox_(?:bunny|sqlite|pg|mysql)\b|under rspec-rails/,
  # bin/demo's steps 3-6 are SQLite through the sqlite3 gem
  %r{bin/demo},
  /\bSQLite3::|\bPG[.:]|\bMysql2\b|\bmysql_(?:client|admin)\b|\bBunny\b|\bActiveRecord\b|\bdummy\b|DocsSamples|rails_app|with_rails|Rails\.application|require_rails/
)

root = File.expand_path("..", __dir__)
files = Dir[File.join(root, "spec", "{unit,integration,docs,kit}", "**", "*_spec.rb")].sort
files.each do |f|
  next if File.read(f).match?(NEEDS_33)

  puts f.delete_prefix("#{root}/")
end
