# frozen_string_literal: true

require "rbconfig"

module AceMQ
  # What lib/acemq/native.rb says when the extension does not load: why, as
  # far as the files can tell, and what to do about it.
  module NativeLoad
    # ELF e_machine values of the CPUs a precompiled gem is built for.
    ELF_MACHINES = { 62 => "x86_64", 183 => "aarch64" }.freeze

    SOURCE_GEM = "install the source gem, which compiles the extension (Rust 1.85+, libclang and Ruby's headers): " \
                 "`gem install acemq --platform ruby`, or in a Bundler app " \
                 "`bundle config set force_ruby_platform true` before `bundle install`."

    module_function

    # The CPU a shared library is built for (its ELF header), nil if the
    # file is not ELF or not one of ELF_MACHINES.
    def built_for(path)
      head = File.binread(path, 20)
      return nil unless head && head.bytesize == 20 && head.start_with?("\x7FELF".b)

      ELF_MACHINES[head.byteslice(18, 2).unpack1("v")]
    rescue SystemCallError
      nil
    end

    # dir: where acemq/<abi>/acemq.so live (lib/acemq); cpu: this machine's.
    def message(error, dir:, checkout:, ruby: RUBY_VERSION, abi: RbConfig::CONFIG["ruby_version"],
                cpu: RbConfig::CONFIG["host_cpu"], dlext: RbConfig::CONFIG["DLEXT"])
      builds = Dir[File.join(dir, "*", "acemq.#{dlext}")].map { |so| File.basename(File.dirname(so))[/\A\d+\.\d+/] }.sort
      minor = ruby[/\A\d+\.\d+/]
      if checkout
        # A checkout (or the source gem, whose extconf.rb builds at install).
        "the native extension is not built for Ruby #{ruby} (#{error}). " \
          "In a checkout run `rake compile`; the source gem builds it at install time (`gem pristine acemq` builds it again)."
      elsif builds.empty?
        "the native extension is missing (#{error}). Reinstall acemq."
      elsif !builds.include?(minor)
        # RubyGems and Bundler choose the source gem for such a Ruby by the
        # platform gem's required_ruby_version; this is reached when that was
        # skipped (--force, --ignore-dependencies, an unpacked gem).
        "this precompiled acemq gem has builds for Ruby " \
          "#{builds.join(', ')}, not for #{ruby}. To use acemq on this Ruby, #{SOURCE_GEM}"
      else
        so = [abi, minor].map { |name| File.join(dir, name, "acemq.#{dlext}") }.find { |f| File.exist?(f) }
        other = built_for(so) if so
        if other && other != cpu
          # A gem directory, vendor/bundle or image layer made on another
          # machine: the right gem is the other precompiled one, not a compile.
          "this is the #{other}-linux gem and this machine is #{cpu} (#{error}). Install the #{cpu}-linux gem: " \
            "`gem install acemq --platform #{cpu}-linux`, or in a Bundler app `bundle lock --add-platform #{cpu}-linux` " \
            "and `bundle install` on this machine (a vendor/bundle or gem directory copied from an #{other} machine " \
            "brings its build)."
        elsif error.to_s.include?("libsqlite3")
          "the precompiled extension for Ruby #{ruby} needs the system SQLite library, libsqlite3.so.0, which did not " \
            "load (#{error}). Install it: libsqlite3-0 on Debian and Ubuntu, sqlite-libs on RHEL, Fedora and Amazon Linux."
        else
          # Another libc (musl), a glibc older than the one it was linked
          # against.
          "the precompiled extension for Ruby #{ruby} did not load (#{error}). " \
            "It is built for #{other || cpu} Linux with glibc 2.34 or newer; elsewhere (musl, Alpine, an older glibc), " \
            "#{SOURCE_GEM}"
        end
      end
    end
  end
end
