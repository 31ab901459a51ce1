# frozen_string_literal: true

# No Bundler: the gems are the system's (Debian's ruby-railties and friends),
# and AceMQ is this checkout, not an installed gem, so the application always
# runs the code under test.
$LOAD_PATH.unshift(File.expand_path("../../../lib", __dir__))
