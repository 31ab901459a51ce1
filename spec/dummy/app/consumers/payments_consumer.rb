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
