require "bunny"
conn = Bunny.new("amqp://guest:guest@127.0.0.1:5699", heartbeat: 0)
conn.start
ch = conn.create_channel
q = ch.queue("acemq.fuzz.seed.#{Process.pid}", exclusive: true)
x = ch.default_exchange
now = Time.at(1_790_000_000)
# An AceMQ message as it publishes them.
x.publish('{"order_id":"A-1","amount":4200}', routing_key: q.name, content_type: "application/json", persistent: true,
  message_id: "0193a0c2-7e1f-7cc2-8b1a-6f1d2c3b4a59", type: "payment.requested.v1", app_id: "billing", timestamp: now.to_i,
  headers: { "x-acemq-id" => "0193a0c2-7e1f-7cc2-8b1a-6f1d2c3b4a59", "x-acemq-attempt" => 2, "x-acemq-origin" => "billing", "tenant" => "acme",
             "traceparent" => "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" })
# A foreign message with every property and header types of all kinds.
x.publish('[1,2.5,"x",null,true,{"a":{"b":[]}}]', routing_key: q.name, content_type: "application/vnd.acme+json; charset=utf-8",
  content_encoding: "gzip", priority: 5, correlation_id: "c-1", reply_to: "replies", expiration: "60000",
  message_id: "m-2", timestamp: now.to_i, type: "t", user_id: "guest", app_id: "py", cluster_id: "",
  headers: { "int" => -7, "big" => 2**40, "float" => 1.5, "bool" => false, "nil" => nil, "time" => now, "arr" => [1, "two", [3, { "four" => 4 }]],
             "x-death" => [{ "count" => 1, "reason" => "rejected", "queue" => "payments", "time" => now, "exchange" => "", "routing-keys" => ["payments"] }],
             "tbl" => { "a" => { "b" => { "c" => "d" } } } })
# Plain bodies, no properties.
x.publish("not json", routing_key: q.name)
x.publish("", routing_key: q.name, content_type: "text/plain")
x.publish("x" * 300, routing_key: q.name, delivery_mode: 1)
got = 0
q.subscribe(manual_ack: true) { |d, _p, _b| ch.ack(d.delivery_tag); got += 1 }
sleep 0.05 until got == 5
ch.basic_get(q.name) rescue nil
x.publish('{"get":1}', routing_key: q.name, content_type: "application/json")
sleep 0.2
ch.basic_get(q.name, manual_ack: false)
conn.close
