# frozen_string_literal: true

# Loaded before the native library, which looks these classes up once and
# maps the engine's error kinds onto them.
module AceMQ
  # Everything AceMQ raises.
  class Error < StandardError; end

  module AMQP
    class Error < AceMQ::Error; end

    # Raise it (or a subclass) from a handler to reject the message: it goes
    # to {queue}.dlq at once instead of climbing the retry ladder.
    class FatalError < Error; end

    # The gem's own files, as backtraces name them. The frames at the bottom
    # of a handler's backtrace that are all in here (the consumer loop that
    # called the handler, the same for every failure) are left out of its
    # copy's x-acemq-backtrace, so its 20 frames go to the application's.
    # Frames of the gem above the handler's (a helper that raised) stay.
    GEM_FRAMES = "#{File.dirname(File.expand_path(__FILE__))}/".freeze

    # A setting that cannot work: a retry policy with max_attempts 0, a
    # negative delay, a prefetch of 0. Raised at declaration, not at the first
    # failure.
    class ConfigurationError < ArgumentError; end

    # The URL is not amqp://, amqps:// or memory://, or does not parse.
    class InvalidURL < ConfigurationError; end

    class ConnectionError < Error; end
    # The broker could not be reached within connect_timeout.
    class ConnectionFailed < ConnectionError; end
    # An amqps:// connection failed in TLS: the broker's certificate is not
    # signed by a trusted CA, has expired or names another host, or the
    # broker refused (or wanted) a client certificate. A ConnectionFailed,
    # so a rescue of that still catches it; unlike a broker that is down,
    # dialling again will not help until a setting or a certificate changes.
    class TLSError < ConnectionFailed; end
    # The connection (or the channel it needed) is closed.
    class ConnectionClosed < ConnectionError; end

    # The broker answered with an AMQP error; reply_code says which.
    class BrokerError < Error
      def initialize(message = nil, reply_code: nil)
        super(message)
        @reply_code = reply_code
      end

      def reply_code
        @reply_code || self.class::REPLY_CODE
      end

      REPLY_CODE = nil
    end

    # 404: the exchange or queue does not exist. Declare it with a Topology.
    class NotFound < BrokerError
      REPLY_CODE = 404
    end

    # 406: a declaration conflicts with what exists (different arguments).
    class PreconditionFailed < BrokerError
      REPLY_CODE = 406
    end

    # 403: the user may not do this.
    class AccessRefused < BrokerError
      REPLY_CODE = 403
    end

    # 403 at connect time: the user or password is wrong.
    class AuthenticationFailed < ConnectionError
      def reply_code = 403
    end

    # The publish matched no queue, and the broker returned it: nothing was stored.
    class Unroutable < Error; end
    # The broker nacked the publish: it was not stored.
    class PublishNacked < Error; end
    # A confirm (or another broker round trip) did not arrive in time. Not
    # named Timeout: `include AceMQ::AMQP` at top level would make that
    # constant visible from Object, and a later `require "timeout"` (so
    # active_record, net/http, bunny) would fail with "Timeout is not a module".
    class TimeoutError < Error; end
    # A payload that is not JSON, or cannot be made into JSON.
    class EncodingError < Error; end
    # An idempotency or outbox store, or its SQL connection, failed.
    class StoreError < Error; end
    # RabbitMQ blocked publishing on the connection (a memory or disk alarm)
    # for longer than confirm_timeout. Consumers keep running on their own
    # connection; the block lifts when the alarm clears.
    class Blocked < Error; end

    # A request's responder failed: its handler raised, returned an error or
    # rejected the request, and its consumer sent back an error reply
    # (docs/request-reply.md, "When the responder fails"). The message is
    # the responder's own; remote_class its error class (nil for a handler's
    # reject with a reason); remote_backtrace its first frames (at most 20
    # lines, 4 KiB), which Connection#request also puts at the top of
    # #backtrace, above the requester's own frames, as DRb does.
    #
    # Read from headers any publisher can set: each is only what could be
    # read as text, bounded, whatever was sent.
    class RemoteError < Error
      def initialize(message = nil, remote_class: nil, remote_backtrace: nil)
        super(message)
        @remote_class = remote_class
        @remote_backtrace = remote_backtrace
      end

      attr_reader :remote_class

      def remote_backtrace = @remote_backtrace || []
    end

    # A handler that did not return: it raised an exception that is not a
    # StandardError (a bare Exception, NoMemoryError, SystemExit) or its
    # thread was killed. Handed to on_error, and the reason its message goes
    # round the retry ladder; a fresh thread takes the dead one's place.
    class HandlerAborted < Error; end

    # A publish to a partitioned consumer whose key came out nil: the
    # class's partitions by: must return a key for every message.
    class PartitionKeyMissing < Error; end

    # Not raised: what a startup check found questionable in a consumer's
    # settings (a quorum queue's delivery limit below max_attempts, an
    # idempotent consumer with no retries to wait on), handed to on_error
    # when the consumer starts. The message says what to change.
    class ConfigurationWarning < Error; end
  end
end
