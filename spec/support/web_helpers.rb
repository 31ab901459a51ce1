# frozen_string_literal: true

require "net/http"
require "uri"

# The dashboard's specs: spec/dummy served in a child process (its own
# Rails, as an application runs it), and plain HTTP against it.
module WebHelpers
  ROOT = File.expand_path("../..", __dir__)

  # Starts spec/dummy on a free port showing `queues`; returns [pid, base URL].
  def self.start_dummy(queues:, runners: [])
    env = { "ACEMQ_WEB_QUEUES" => queues.join(","), "ACEMQ_WEB_RUNNERS" => runners.join(","), "PORT" => "0",
            "RAILS_ENV" => "test", "AMQP_URL" => AceMQSpecHelpers::AMQP_URL,
            "ACEMQ_DUMMY_SQLITE" => File.join(Dir.tmpdir, "acemq-web-#{Process.pid}.sqlite3"),
            "DATABASE_URL" => nil, "RUBYLIB" => File.join(ROOT, "lib") }
    env.delete("ACEMQ_WEB_RUNNERS") if runners.empty?
    reader, writer = IO.pipe
    pid = Process.spawn(env, RbConfig.ruby, "spec/fixtures/web_dummy_server.rb", chdir: ROOT, out: writer,
                                                                                 err: File::NULL)
    writer.close
    line = reader.wait_readable(60) && reader.gets
    raise "spec/dummy did not start: #{line.inspect}" unless line&.start_with?("port=")

    Thread.new { reader.each_line { nil } } # keep the pipe drained
    [pid, "http://127.0.0.1:#{line[/\d+/]}"]
  end

  def self.stop(pid)
    return unless pid

    Process.kill("TERM", pid)
    Process.wait(pid)
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  end

  # A tiny browser: keeps cookies, returns Net::HTTPResponse.
  class Client
    attr_reader :cookies

    def initialize(base)
      @base = URI(base)
      @cookies = {}
    end

    def get(path) = request(Net::HTTP::Get.new(path))

    def post(path, form, headers = {})
      req = Net::HTTP::Post.new(path)
      req.set_form_data(form)
      headers.each { |k, v| req[k] = v }
      request(req)
    end

    private

    def request(req)
      req["Cookie"] = @cookies.map { |k, v| "#{k}=#{v}" }.join("; ") unless @cookies.empty?
      res = Net::HTTP.start(@base.host, @base.port) { |h| h.request(req) }
      Array(res.get_fields("set-cookie")).each do |c|
        k, v = c.split(";").first.split("=", 2)
        @cookies[k] = v
      end
      res
    end
  end
end
