# frozen_string_literal: true

require "fileutils"
require "socket"

module Drill
  # A PostgreSQL of the drill's own (.ci/postgres makes it: initdb, trust,
  # a database `test`), which the database phase stops, starts and whose
  # backends it terminates. The shared server on 5432 is never touched.
  class PrivatePostgres
    BIN = Dir["/usr/lib/postgresql/*/bin"].max_by { |d| d[%r{postgresql/(\d+)}, 1].to_i }
    CI = File.expand_path("../.ci/postgres", __dir__)

    attr_reader :port, :dir

    def initialize(dir:, port: nil)
      @dir = dir
      @port = port || free_port
    end

    # application_name tags each connection, so the phase can find the
    # backends to terminate and leave its own alone.
    def url(app = "drill") = "postgres://postgres@127.0.0.1:#{port}/test?application_name=#{app}"

    def create
      out = IO.popen([CI, "start", port.to_s, dir], err: %i[child out], &:read)
      raise Failure, "could not start a private PostgreSQL on #{port}: #{out}" unless $?.success?

      self
    end

    # mode: "immediate" (no shutdown checkpoint, clients cut at once: what a
    # crash looks like to them) or "fast".
    def stop(mode = "immediate") = pg_ctl("-m", mode, "-w", "stop")

    def start
      pg_ctl("-l", File.join(dir, "server.log"), "-w", "-t", "60", "-o",
             "-p #{port} -k #{dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
    end

    def destroy
      system(CI, "stop", dir, out: File::NULL, err: File::NULL)
      FileUtils.rm_rf(dir)
    end

    private

    def pg_ctl(*args)
      out = IO.popen(["runuser", "-u", "postgres", "--", File.join(BIN, "pg_ctl"), "-D", File.join(dir, "data"), *args],
                     err: %i[child out], &:read)
      raise Failure, "pg_ctl #{args.last} failed: #{out}" unless $?.success?
    end

    def free_port
      s = TCPServer.new("127.0.0.1", 0)
      s.addr[1]
    ensure
      s&.close
    end
  end
end
