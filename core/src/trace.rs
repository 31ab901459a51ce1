//! Tracing: the W3C trace context a message carries, and the engine's spans.
//!
//! A publisher's `traceparent` and `tracestate` are ordinary AMQP headers.
//! The engine never writes them: every copy it makes (a retry rung, the
//! dead-letter queue, a replay, an outbox row and its relay) carries the
//! header table it received, so they arrive as the publisher wrote them, and
//! a copy too large for one frame drops other headers first (see
//! [`crate::limits::fit_copy`]).
//!
//! The engine's spans use the [`tracing`] crate, named for the OpenTelemetry
//! messaging conventions for RabbitMQ, so a service exports them with its own
//! layer (tracing-opentelemetry reads `otel.name` and `otel.kind`):
//!
//! - `publish` (producer): around sending a message and waiting for its
//!   confirm;
//! - `process` (consumer): from the moment a delivery is handed to a handler
//!   until it is settled, the push consumer's handler running inside it.
//!
//! Both carry `acemq.traceparent` (empty when the message has none); a
//! service links its consumer span to the producer's context with
//! [`parent`].

use crate::envelope::Envelope;
use crate::headers::Headers;
use crate::message::Message;
use serde_json::Value;
use tracing::Span;

/// The W3C header naming the trace and the span a message was sent from.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// The W3C header carrying vendors' trace state beside it.
pub const TRACESTATE_HEADER: &str = "tracestate";

/// The longest `traceparent` kept whatever else must go when a copy is too
/// large for one frame. Version 00 is 55 bytes; later versions may append
/// fields, and a value far past that is not a trace context.
pub const MAX_TRACEPARENT: usize = 255;
/// The longest `tracestate` kept the same way: W3C asks every hop to pass on
/// at least 512 characters of it.
pub const MAX_TRACESTATE: usize = 512;

/// The trace context a message carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `traceparent`, as it arrived: `00-{trace id}-{parent id}-{flags}`.
    pub traceparent: String,
    /// `tracestate`, as it arrived, when there was one.
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The context in `headers`, or None when there is no `traceparent` or
    /// it is not one W3C would accept (a reader must then ignore it; the
    /// header itself still travels untouched).
    pub fn from_headers(headers: &Headers) -> Option<TraceContext> {
        let traceparent = headers.get(TRACEPARENT_HEADER)?.as_str()?;
        if !valid_traceparent(traceparent) {
            return None;
        }
        Some(TraceContext {
            traceparent: traceparent.to_owned(),
            tracestate: headers.get(TRACESTATE_HEADER).and_then(Value::as_str).map(str::to_owned),
        })
    }

    /// The trace id: 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The id of the span the message was sent from: 16 hex digits.
    pub fn parent_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// The sampled flag.
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.traceparent[53..55], 16).is_ok_and(|f| f & 1 == 1)
    }

    /// Put this context into `headers`, for a publish (what a Rust service
    /// does with the context its own OpenTelemetry layer gives it).
    pub fn insert_into(&self, headers: &mut Headers) {
        headers.insert(TRACEPARENT_HEADER.into(), Value::from(self.traceparent.clone()));
        match &self.tracestate {
            Some(s) => headers.insert(TRACESTATE_HEADER.into(), Value::from(s.clone())),
            None => headers.remove(TRACESTATE_HEADER),
        };
    }
}

/// The producer's trace context of a delivered message, to link a consumer
/// span with (or parent it on) in the service's own OpenTelemetry layer.
pub fn parent(message: &Message) -> Option<TraceContext> {
    TraceContext::from_headers(&message.envelope.headers)
}

/// Whether `s` is a `traceparent` as W3C Trace Context level 1 reads one:
/// version 00 exactly, a later version by its first four fields.
pub fn valid_traceparent(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c));
    let zero = |r: std::ops::Range<usize>| b[r].iter().all(|c| *c == b'0');
    if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return false;
    }
    let version_ok = hex(0..2) && &s[0..2] != "ff" && (if &s[0..2] == "00" { b.len() == 55 } else { b.len() == 55 || b[55] == b'-' });
    version_ok && hex(3..35) && !zero(3..35) && hex(36..52) && !zero(36..52) && hex(53..55)
}

/// Whether header `name` with `value` is trace context that a copy keeps
/// whatever else it must drop to fit in one frame.
pub(crate) fn kept_on_copies(name: &str, value: &Value) -> bool {
    match (name, value) {
        (TRACEPARENT_HEADER, Value::String(s)) => s.len() <= MAX_TRACEPARENT,
        (TRACESTATE_HEADER, Value::String(s)) => s.len() <= MAX_TRACESTATE,
        _ => false,
    }
}

fn traceparent_of(headers: &Headers) -> &str {
    headers.get(TRACEPARENT_HEADER).and_then(Value::as_str).unwrap_or("")
}

/// The producer span for publishing `envelope` to `exchange` with
/// `routing_key`; `error.type` is recorded when the broker refuses it.
/// Disabled (and nearly free) when no subscriber wants it.
pub fn publish_span(exchange: &str, routing_key: &str, envelope: &Envelope) -> Span {
    tracing::info_span!(
        target: "acemq",
        "publish",
        otel.name = %format_args!("publish {}", if exchange.is_empty() { "amq.default" } else { exchange }),
        otel.kind = "producer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "publish",
        messaging.operation.name = "publish",
        messaging.destination.name = exchange,
        messaging.rabbitmq.destination.routing_key = routing_key,
        messaging.message.id = envelope.id.as_str(),
        acemq.traceparent = traceparent_of(&envelope.headers),
        error.type = tracing::field::Empty,
    )
}

/// The consumer span for processing `message`, delivered from `queue` with
/// `delivery_tag`. `acemq.outcome` is recorded when it is settled.
pub fn process_span(message: &Message, delivery_tag: u64) -> Span {
    let d = &message.delivery;
    process_span_from(&d.queue, &d.exchange, &d.routing_key, message, delivery_tag)
}

/// [`process_span`] with where the delivery came from given apart from the
/// message: a consumer's hand-out reads it off the delivery, since a message
/// admitted lean (`Consumer::admit_lean`, the Ruby extension's) carries none.
pub(crate) fn process_span_from(queue: &str, exchange: &str, routing_key: &str, message: &Message, delivery_tag: u64) -> Span {
    tracing::info_span!(
        target: "acemq",
        "process",
        otel.name = %format_args!("process {queue}"),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = exchange,
        messaging.rabbitmq.destination.routing_key = routing_key,
        messaging.rabbitmq.message.delivery_tag = delivery_tag,
        messaging.message.id = message.envelope.id.as_str(),
        acemq.queue = queue,
        acemq.attempt = message.envelope.attempt,
        acemq.traceparent = traceparent_of(&message.envelope.headers),
        acemq.outcome = tracing::field::Empty,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn reads_a_w3c_traceparent_and_refuses_what_w3c_refuses() {
        let mut h = Headers::new();
        h.insert(TRACEPARENT_HEADER.into(), Value::from(TP));
        h.insert(TRACESTATE_HEADER.into(), Value::from("congo=t61rcWkgMzE"));
        let c = TraceContext::from_headers(&h).unwrap();
        assert_eq!(c.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.parent_id(), "00f067aa0ba902b7");
        assert!(c.sampled());
        assert_eq!(c.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        let mut back = Headers::new();
        c.insert_into(&mut back);
        assert_eq!(back, h);

        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        ] {
            assert!(!valid_traceparent(bad), "{bad}");
        }
        assert!(valid_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-later"));
        h.insert(TRACEPARENT_HEADER.into(), Value::from(7));
        assert_eq!(TraceContext::from_headers(&h), None);
    }
}
