# frozen_string_literal: true

require "net/http"
require "uri"

# The dashboard's specs: spec/dummy served in a child process (its own
# Rails, as an application runs it), and plain HTTP against it.
module WebHelpers
  ROOT = File.expand_path("../..", __dir__)
  CHROMIUM = "/usr/bin/chromium"
  CHROMEDRIVER = "/usr/bin/chromedriver"

  # Why the Chromium specs cannot run here, or nil (having loaded Capybara
  # and selenium-webdriver): ACEMQ_BROWSER_SPECS=skip (what a browser sees
  # does not change with the broker, so .ci/stage-rabbitmq40 sets it), no
  # Chromium, or no Capybara. web_spec.rb covers the dashboard at the Rack
  # level everywhere.
  def self.browser_missing
    return "ACEMQ_BROWSER_SPECS=skip (spec/integration/web_spec.rb covers the dashboard at the Rack level)" if ENV["ACEMQ_BROWSER_SPECS"] == "skip"
    unless File.executable?(CHROMIUM) && File.executable?(CHROMEDRIVER)
      return "no Chromium here (Debian's chromium and chromium-driver): the Debian 12 stage of .ci/run runs these; " \
             "spec/integration/web_spec.rb covers the dashboard at the Rack level on every stage"
    end

    require "capybara"
    require "capybara/dsl"
    require "selenium-webdriver"
    nil
  rescue LoadError => e
    "no Capybara or selenium-webdriver (#{e.message}): bin/setup installs ruby-capybara and ruby-selenium-webdriver"
  end

  # A headless Chromium of its own, named `driver`, its profile (so its
  # cookies: another operator) in the directory `profile`, at 1280x800.
  def self.chromium(driver, profile)
    Capybara.register_driver(driver) do |app|
      options = Selenium::WebDriver::Chrome::Options.new
      %w[--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
         --disable-component-update --disable-sync --window-size=1280,800].each { |a| options.add_argument(a) }
      options.add_argument("--user-data-dir=#{profile}")
      options.binary = CHROMIUM
      Capybara::Selenium::Driver.new(app, browser: :chrome, options: options,
                                          service: Selenium::WebDriver::Service.chrome(path: CHROMEDRIVER))
    end
    Capybara.default_max_wait_time = 5
    Capybara.enable_aria_label = true
    Capybara::Session.new(driver)
  end

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
