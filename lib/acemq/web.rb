# frozen_string_literal: true

require "erb"
require "json"
require "securerandom"
require "uri"
require "acemq/amqp"
require "acemq/secure_compare"
require "acemq/status"
require "acemq/web/source"
require "acemq/web/views"

module AceMQ
  # The dashboard: a Rack application, mounted in a Rails app's routes
  #
  #   mount AceMQ::Web => "/acemq"
  #
  # or served on its own by `acemq web`. Server-rendered HTML with a little
  # plain JavaScript (the overview's numbers, the queue's chart). Pages: the
  # overview (every consumer queue, every runner process, the outbox), a
  # queue (its ladder, a chart of the samples this process keeps, its newest
  # dead letters), the DLQ browser (filters, pages, every header) and the
  # actions (replay one, the selected or all matching; discard one or the
  # selected; purge), each confirmed on a page of its own before it runs.
  #
  # Authentication is the host's (a routes constraint or any Rack
  # middleware: AceMQ::Web.use adds one in front of the default app).
  # Read-only: AceMQ::Web.configure { |c| c.read_only = true }, an instance
  # of its own (AceMQ::Web.new(read_only: true)), or the host setting
  # env["acemq.web.read_only"] per request. Every POST needs the page's CSRF
  # token (docs/web.md says how it works).
  class Web
    # url: the broker (default: AceMQ::Rails.config.url, else AMQP_URL);
    # connection: an open Connection to use instead; queues: the queues to
    # show (default: the Rails app's consumers'); runners: base URLs of
    # runners' health endpoints (default: config.health_port's on this
    # machine); outbox: a store with #backlog (default: the Rails app's);
    # read_only: true, or a callable given the Rack env; page_size: dead
    # letters a DLQ page shows; rabbitmqctl: a command (Array or String) to
    # run `list_queues` with for unacked counts, nil for none.
    # control_token: the runners' control token for Pause/Resume (default
    # ACEMQ_CONTROL_TOKEN; none is needed for a runner on this machine).
    # management_url: the management plugin's HTTP API
    # (http://user:password@host:15672/): every count and unacked in one
    # round trip, and the head messages' ages. rungs: the retry rungs of
    # the queues named in queues: (delays such as "1s", or full names; a
    # Hash by queue); without it they are read from the management API, or
    # not shown. read_within: seconds a DLQ filter reads before it gives up
    # and says how far it read (5).
    # dead_letter_store: store mode (docs/web.md): a SQLDeadLetterStore,
    # :active_record, a callable returning one, or a database URL or
    # SQLite path (default: AceMQ::Rails.config.dead_letter_store; false
    # for none); the DLQ pages then read it, not the queue. actor: a
    # callable given the Rack env, naming who acts for the audit (default
    # REMOTE_USER, else "web"). replay_rate: messages a second a replay
    # from the store sends (default the store's, 50).
    Config = Struct.new(:url, :connection, :queues, :runners, :outbox, :read_only, :page_size, :rabbitmqctl,
                        :control_token, :management_url, :rungs, :read_within, :dead_letter_store, :actor,
                        :replay_rate, keyword_init: true)

    READ_ONLY_ENV = "acemq.web.read_only"
    CSRF_COOKIE = "acemq_csrf"
    CSRF_FIELD = "_csrf"

    class << self
      def config = (@config ||= Config.new(read_only: false, page_size: 25))

      def configure
        yield config
        reset!
        self
      end

      # Rack middleware in front of the default app (as Sidekiq::Web.use):
      # AceMQ::Web.use Rack::Auth::Basic, "AceMQ" do |user, password| ... end
      def use(middleware, *args, &block)
        middlewares << [middleware, args, block]
        @app = nil
        self
      end

      def middlewares = (@middlewares ||= [])

      # The default app, what `mount AceMQ::Web` serves.
      def call(env) = app.call(env)

      def app
        @app ||= middlewares.reverse.inject(new) { |inner, (m, args, block)| m.new(inner, *args, &block) }
      end

      # Forget the default app (its connection and samples): after configure.
      def reset!
        @app&.then { |a| a.respond_to?(:close) && a.close }
        @app = nil
      end
    end

    attr_reader :source

    def initialize(**overrides)
      settings = Web.config.to_h.merge(overrides)
      @config = Config.new(**settings)
      # A pace a replay cannot keep is refused here, not at the first
      # replay from the page (core's rule: ConfigurationError).
      @config.replay_rate&.then { |r| AMQP::SQLDeadLetterStore.check_replay_rate(Float(r)) }
      @source = Source.new(@config)
    rescue ArgumentError, TypeError => e
      raise e if e.is_a?(AMQP::ConfigurationError)

      raise AMQP::ConfigurationError, "replay_rate must be a number of messages a second (got #{@config.replay_rate.inspect})"
    end

    def close = @source.close

    def call(env)
      request = Request.new(env, read_only: read_only?(env))
      Views.new(request, @source).respond
    rescue Source::BrokerDown, AMQP::Error, Status::Prometheus::Unavailable => e
      # A page whose part is down says which (Views#down handles the
      # broker); this is for anything that escaped it.
      body = "AceMQ::Web: #{e.class}: #{e.message}\n"
      [503, { "content-type" => "text/plain; charset=utf-8", "cache-control" => "no-store" }, [body]]
    end

    private

    def read_only?(env)
      return true if env[READ_ONLY_ENV]

      ro = @config.read_only
      ro.respond_to?(:call) ? ro.call(env) ? true : false : ro ? true : false
    end

    # What a page needs of the request: its path under the mount, its
    # parameters, the CSRF token (the cookie's, made here when absent).
    class Request
      attr_reader :env, :path, :params, :token, :new_token, :unreadable

      def initialize(env, read_only:)
        @env = env
        @read_only = read_only
        # Parameters that could not be decoded (a bad %-escape): a page
        # refuses the request rather than act as if they were not sent.
        @unreadable = []
        @path = env["PATH_INFO"].to_s.empty? ? "/" : env["PATH_INFO"]
        @params = parse(env["QUERY_STRING"].to_s)
        @params.merge!(parse(read_body)) if post? && form?
        cookie = cookies[CSRF_COOKIE]
        @token = cookie.to_s.match?(/\A[0-9a-f]{64}\z/) ? cookie : nil
        @new_token = @token ? nil : (@token = SecureRandom.hex(32))
      end

      def read_only? = @read_only
      def post? = @env["REQUEST_METHOD"] == "POST"
      def get? = %w[GET HEAD].include?(@env["REQUEST_METHOD"])

      # Where the app is mounted: "" standalone, "/acemq" under Rails.
      def base = @env["SCRIPT_NAME"].to_s.chomp("/")

      # The double-submit check: the form's token equals the cookie's (a
      # cookie another site cannot read, sent only from this site: SameSite
      # Strict), and an Origin header, when the browser sends one, is this
      # host's.
      def csrf_ok?
        return false if @new_token

        given = @params[CSRF_FIELD].to_s
        return false unless AceMQ.secure_compare(given, @token)

        origin = @env["HTTP_ORIGIN"]
        origin.nil? || origin == "null" ? origin.nil? : same_origin?(origin)
      end

      def cookie_header
        return nil unless @new_token

        path = base.empty? ? "/" : base
        "#{CSRF_COOKIE}=#{@new_token}; path=#{path}; HttpOnly; SameSite=Strict"
      end

      private

      def form?
        type = @env["CONTENT_TYPE"].to_s
        type.empty? || type.start_with?("application/x-www-form-urlencoded")
      end

      def read_body
        input = @env["rack.input"] or return ""
        input.rewind if input.respond_to?(:rewind)
        body = input.read(1 << 20).to_s
        input.rewind if input.respond_to?(:rewind)
        body
      end

      # Names ending in [] collect every value; others keep the last.
      def parse(query)
        query.split(/[&;]/).each_with_object({}) do |pair, out|
          next if pair.empty?

          k, v = pair.split("=", 2).map { |s| URI.decode_www_form_component(s.to_s) }
          if k.end_with?("[]")
            (out[k.delete_suffix("[]")] ||= []) << v.to_s
          else
            out[k] = v.to_s
          end
        rescue ArgumentError
          @unreadable << pair[0, 60]
          next
        end
      end

      def cookies
        @env["HTTP_COOKIE"].to_s.split(/;\s*/).to_h { |c| c.split("=", 2).then { |k, v| [k, v.to_s] } }
      end

      def same_origin?(origin)
        o = URI(origin)
        h = URI("#{o.scheme}://#{@env['HTTP_HOST']}")
        o.host == h.host && o.port == h.port
      rescue URI::Error, ArgumentError
        false
      end
    end
  end
end
