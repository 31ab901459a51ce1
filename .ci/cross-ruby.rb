# frozen_string_literal: true

# The RUBY that rb-sys runs when .ci/cross-build compiles the extension for
# another machine:
#
#   ruby --disable-gems .ci/cross-ruby.rb TARGET_RBCONFIG --disable-gems -rrbconfig -e CODE
#
# rb-sys reads RbConfig by running `$RUBY --disable-gems -rrbconfig -e CODE`.
# Here CODE sees the target Ruby's RbConfig: its rbconfig.rb (from Debian's
# libruby3.X for arm64, unpacked, not installed), evaluated by this machine's
# Ruby. That file refuses a Ruby of another version (`RUBY_VERSION.start_with?
# ("3.1.") or raise ...`): the raise becomes `true`, and every value
# (headers, flags, ABI) is the target's. Its TOPDIR follows the file, so the
# header paths point into the unpacked tree.
rbconfig = ARGV.shift
code = ARGV[(ARGV.index("-e") || abort("cross-ruby: no -e CODE in #{ARGV.inspect}")) + 1]
source = File.read(rbconfig)
checked = source.sub!(/^(\s*)raise "ruby lib version .*$/) { "#{Regexp.last_match(1)}true" }
abort "cross-ruby: #{rbconfig} has no version check to drop: is it an rbconfig.rb?" unless checked
eval(source, TOPLEVEL_BINDING, rbconfig) # rubocop:disable Security/Eval
eval(code, TOPLEVEL_BINDING, "-e") # rubocop:disable Security/Eval
