# frozen_string_literal: true

require "socket"

# The guide's application code (seeds/000, "The idempotent consumer"), as an
# application would have it under app/: the model, the store, the consumer,
# and the payment gateway it calls.

class ApplicationRecord < ActiveRecord::Base
  self.abstract_class = true
end

# app/models/handled_message.rb
class HandledMessage < ApplicationRecord
  self.table_name = "acemq_idempotency"
  self.primary_key = "message_id"
end

# app/models/active_record_idempotency_store.rb
#
# The claim is the INSERT. That is the entire design: a primary key is the only
# thing in a database that two concurrent transactions cannot both win, so the row
# appearing *is* the answer to "am I the first?" — no read, no lock, no window
# between checking and deciding.
class ActiveRecordIdempotencyStore
  CLAIMED = "CLAIMED"
  CONFIRMED = "CONFIRMED"

  # How long a key is remembered. It has to be longer than the longest a duplicate
  # can take to arrive: the top rung of the retry ladder, a dead-letter queue
  # somebody drains by hand next week, a replay. A day is a starting point, not an
  # answer.
  RETENTION = 24 * 3600

  # How long a claim that never finished is honoured. Longer than the slowest
  # handler, or two consumers will work on one message at once; shorter than
  # anybody's patience, because a consumer killed mid-handler leaves the claim
  # behind and nothing retries the message until it expires.
  CLAIM_TIMEOUT = 300

  def initialize(worker: "#{Socket.gethostname}:#{Process.pid}")
    @worker = worker
  end

  def first_time?(key)
    now = Time.now.utc
    HandledMessage.create!(message_id: key.to_s, state: CLAIMED, claimed_by: @worker,
                           recorded_at: now, expires_at: now + RETENTION)
    true
  rescue ActiveRecord::RecordNotUnique
    # Somebody has the key. Take it over only if their claim has gone stale — and
    # only from a CLAIMED row, never from a CONFIRMED one, which is a message that
    # really was handled.
    taken = HandledMessage.where(message_id: key.to_s, state: CLAIMED)
                          .where(recorded_at: ...(now - CLAIM_TIMEOUT))
                          .update_all(claimed_by: @worker, recorded_at: now,
                                      expires_at: now + RETENTION)
    taken.positive?
  end

  # The handler finished. The key is now a fact rather than a claim, and no stale
  # claim takeover can touch it.
  def confirm(key)
    HandledMessage.where(message_id: key.to_s).update_all(state: CONFIRMED)
    nil
  end

  # The handler did not finish, so the key must not stand: the retry has to be
  # allowed to run. Only this worker's own live claim, and never a CONFIRMED row.
  def forget(key)
    HandledMessage.where(message_id: key.to_s, state: CLAIMED, claimed_by: @worker).delete_all
    nil
  end

  # Nothing on the handling path deletes a row. Schedule this.
  def purge_expired = HandledMessage.where(expires_at: ...Time.now.utc).delete_all
end

# The payment gateway the guide leaves out. A spec stubs it (`allow(Payments)
# .to receive(:charge!)`), so it only has to exist with the right arity.
module Payments
  class GatewayDown < StandardError; end

  def self.charge!(_order_id, _amount_cents) = nil
end

# app/consumers/payments_consumer.rb
class PaymentsConsumer < AceMQ::Rails::Consumer
  queue "shop.payments"
  retries max_attempts: 5, initial_delay: 1, max_delay: 300

  STORE = ActiveRecordIdempotencyStore.new

  def call(message)
    once.call(message)
  end

  private

  # Built once per instance, because the runner keeps one instance of each
  # consumer class for the life of the process.
  def once
    @once ||= AceMQ::AMQP::Patterns.idempotent(STORE) do |m|
      Payments.charge!(m.payload["order_id"], m.payload["amount_cents"])
      accept
    end
  end
end
