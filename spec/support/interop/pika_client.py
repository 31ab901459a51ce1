"""A pika (Python) client for spec/integration/interop_pika_spec.rb.

    python pika_client.py publish URL QUEUE   < messages.json
    python pika_client.py get URL QUEUE COUNT > messages.json

publish sends each message of a JSON array, in order, through the default
exchange: {"body_hex", "properties": {...}, "headers": {...}} where a header
value {"bytes_hex": "..."} is sent as bytes (AMQP byte array 'x').
get takes COUNT messages off QUEUE (acknowledged) and prints them as the same
JSON, every property pika read, bytes as hex.
"""
import json
import sys

import pika


def connect(url):
    return pika.BlockingConnection(pika.URLParameters(url))


def decode(value):
    if isinstance(value, dict) and set(value) == {"bytes_hex"}:
        return bytes.fromhex(value["bytes_hex"])
    return value


def encode(value):
    if isinstance(value, bytes):
        return {"bytes_hex": value.hex()}
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [encode(v) for v in value]
    return value


def publish(url, queue):
    conn = connect(url)
    ch = conn.channel()
    ch.confirm_delivery()
    for m in json.load(sys.stdin):
        props = dict(m.get("properties", {}))
        props["headers"] = {k: decode(v) for k, v in m.get("headers", {}).items()}
        ch.basic_publish("", queue, bytes.fromhex(m["body_hex"]), pika.BasicProperties(**props))
    conn.close()


PROPERTIES = ["content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
              "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id"]


def get(url, queue, count):
    conn = connect(url)
    ch = conn.channel()
    out = []
    while len(out) < count:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            conn.sleep(0.05)
            continue
        m = {"body_hex": body.hex(), "properties": {p: getattr(props, p) for p in PROPERTIES},
             "headers": encode(props.headers or {})}
        out.append(m)
    conn.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    if sys.argv[1] == "publish":
        publish(sys.argv[2], sys.argv[3])
    else:
        get(sys.argv[2], sys.argv[3], int(sys.argv[4]))
