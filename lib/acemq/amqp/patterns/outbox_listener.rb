# frozen_string_literal: true

module AceMQ
  module AMQP
    module Patterns
      # The PostgreSQL half of the relay's wake-up: a connection of its own
      # that LISTENs on the outbox table's channel. Every add sends a NOTIFY
      # there in its own statement, which PostgreSQL delivers when the add's
      # transaction commits (never after a rollback), so the relay sweeps as
      # soon as rows are committed by any process. A connection of its own
      # because the wait blocks it: the store's connection stays free for the
      # sweeps (and for another thread's OutboxRelay#sweep).
      #
      # Why not core's LISTEN (the Rust relay's, sql/postgres.rs): that one is
      # tokio-postgres without TLS, and the gem links no PostgreSQL client;
      # this one is the application's own libpq, with whatever sslmode and
      # certificates its conninfo names. It feeds the same wake-up as
      # core's (OutboxRelay's LISTEN thread tells the cycle), and is opened
      # again as core's is: after a pause doubling from 0.1 s to 5 s, with
      # a sweep once it listens again, since rows may have been committed
      # while nobody listened (outbox_wake_spec: three cuts in a row).
      class OutboxListener
        # conninfo: a PG conninfo string or hash; channel: a plain identifier
        # (the store's, made by core from a checked table name).
        def initialize(conninfo, channel)
          require "pg"
          @conn = PG.connect(*OutboxListener.bounded(conninfo))
          # A lost connection is raised by wait and told to on_error; libpq
          # would also print the server's parting FATAL to stderr.
          @conn.set_notice_processor { |_| }
          @conn.exec("LISTEN #{@conn.quote_ident(channel)}")
        end

        # A connect to a server that accepts and never answers would wait
        # for ever, and the relay would never hear of it: libpq's
        # connect_timeout, unless the conninfo names its own.
        CONNECT_TIMEOUT = 10

        def self.bounded(conninfo)
          named = if conninfo.is_a?(Hash)
                    conninfo.key?(:connect_timeout) || conninfo.key?("connect_timeout")
                  else
                    PG::Connection.conninfo_parse(conninfo.to_s).any? { |o| o[:keyword] == "connect_timeout" && o[:val] }
                  end
          return [conninfo] if named

          conninfo.is_a?(Hash) ? [conninfo.merge(connect_timeout: CONNECT_TIMEOUT)] : [conninfo, { connect_timeout: CONNECT_TIMEOUT }]
        rescue PG::Error
          [conninfo] # PG.connect says what is wrong with it
        end

        # Whether a notification came within timeout seconds. ruby-pg waits
        # on the socket with the GVL released.
        def wait(timeout)
          !@conn.wait_for_notify(timeout).nil?
        end

        def close
          @conn.close unless @conn.finished?
        rescue StandardError
          nil
        end
      end
    end
  end
end
