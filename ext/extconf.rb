# frozen_string_literal: true

# What `gem install` runs. There is no rb_sys gem on every machine, so this
# writes a plain Makefile: `make` builds the extension crate with cargo, and
# `make install` copies it to $(sitearchdir)/acemq/acemq.so, which RubyGems
# points at the gem's extension directory.
require "rbconfig"
require "shellwords"

root = File.expand_path("..", __dir__)
cargo = ENV.fetch("CARGO", "cargo")
profile = ENV.fetch("ACEMQ_PROFILE", "release")
target_dir = ENV.fetch("CARGO_TARGET_DIR", File.join(root, "target"))
dlext = RbConfig::CONFIG["DLEXT"]
built = File.join(target_dir, profile, "libacemq_ext.so")
sitearchdir = RbConfig::CONFIG["sitearchdir"]

File.write("Makefile", <<~MAKE)
  SHELL = /bin/sh
  sitearchdir = #{sitearchdir}
  RUBY = #{RbConfig.ruby}

  all: acemq.#{dlext}

  acemq.#{dlext}:
  \tcd #{root.shellescape} && RUBY=$(RUBY) CARGO_TARGET_DIR=#{target_dir.shellescape} #{cargo} build --locked --profile #{profile} -p acemq-ext
  \tcp #{built.shellescape} acemq.#{dlext}

  install: acemq.#{dlext}
  \tmkdir -p $(DESTDIR)$(sitearchdir)/acemq
  \tcp acemq.#{dlext} $(DESTDIR)$(sitearchdir)/acemq/acemq.#{dlext}

  clean:
  \trm -f acemq.#{dlext}

  .PHONY: all install clean
MAKE
