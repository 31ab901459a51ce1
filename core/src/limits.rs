//! The bounds of what the engine sends: every name and short string fits
//! AMQP's 255 bytes, header tables stay shallow, and what the engine itself
//! writes (a reason, an error class) is cut to a size with a marker. Checked
//! before anything reaches a transport, so `memory://` refuses exactly what
//! RabbitMQ would, and nothing reaches lapin's encoder that would panic
//! (`ShortString` past 255 bytes) or make the broker close the connection
//! (a frame past frame_max).

use crate::error::{Error, Result};
use crate::headers::Headers;
use crate::retry::{dlq_name, rung_name, RetryPolicy};
use crate::wire::{Props, ORIGINAL_EXPIRATION_HEADER};
use serde_json::Value;

/// AMQP's short string, and RabbitMQ's limit for exchange, queue and
/// routing-key names.
pub const MAX_SHORT: usize = 255;

/// How deep a header table may nest in what the engine sends. RabbitMQ
/// accepts more; a client's parser (lapin's among them) recurses once per
/// level, and a table nested a thousand deep is a stack overflow for
/// whoever reads it.
pub const MAX_HEADER_DEPTH: usize = 32;

/// The frame_max an `amqp://` connection proposes when its URL names none:
/// RabbitMQ's default, so the least of it and the broker's is what is
/// negotiated. It bounds one frame, not a message (a body spans as many
/// frames as it needs, up to the broker's `max_message_size`).
pub const FRAME_MAX: u32 = 128 * 1024;

/// The properties and headers of one message must fit in the single
/// content-header frame AMQP allows them: frame_max ([`FRAME_MAX`] unless
/// the URL lowers it) less the frame's own fields.
pub const MAX_PROPERTIES: usize = FRAME_MAX as usize - 1024;

/// The longest reason the engine writes into `x-acemq-reason`. A reason is
/// for a person reading the DLQ; an exception message of 300 KB copied
/// whole made a copy the broker refused, which put the message back for
/// ever.
pub const MAX_REASON: usize = 4096;

/// A name or short string: at most 255 bytes, or an error saying which and
/// what to do.
pub fn short(what: &str, value: &str) -> Result<()> {
    if value.len() > MAX_SHORT {
        return Err(Error::invalid(format!(
            "{what} is {} bytes ({}...): AMQP allows {MAX_SHORT} at most; shorten it",
            value.len(),
            prefix(value, 40)
        )));
    }
    Ok(())
}

/// A queue the engine consumes or declares: its own name and its
/// dead-letter queue's must fit.
pub fn queue(name: &str) -> Result<()> {
    short("queue name", name)?;
    let dlq = dlq_name(name);
    if dlq.len() > MAX_SHORT {
        return Err(Error::invalid(format!(
            "queue name is {} bytes: its dead-letter queue {}... would be {}, past AMQP's {MAX_SHORT}; keep queue names to {} bytes",
            name.len(),
            prefix(&dlq, 40),
            dlq.len(),
            MAX_SHORT - (dlq.len() - name.len())
        )));
    }
    Ok(())
}

/// A consumer's queue with its retry ladder: every rung's name must fit.
pub fn ladder(name: &str, policy: &RetryPolicy) -> Result<()> {
    queue(name)?;
    for delay in policy.rungs() {
        let rung = rung_name(name, delay);
        if rung.len() > MAX_SHORT {
            return Err(Error::invalid(format!(
                "queue name is {} bytes: its retry rung {}... would be {}, past AMQP's {MAX_SHORT}; shorten the queue name",
                name.len(),
                prefix(&rung, 40),
                rung.len()
            )));
        }
    }
    Ok(())
}

/// Where a publish goes, and what it carries.
pub fn outgoing(exchange: &str, routing_key: &str, props: &Props) -> Result<()> {
    short("exchange name", exchange)?;
    short("routing key", routing_key)?;
    properties(props)
}

/// Properties as they will be encoded: short strings, header names and
/// depth, and the total.
pub fn properties(props: &Props) -> Result<()> {
    for (what, v) in [
        ("message id", &props.message_id),
        ("type", &props.kind),
        ("origin (app_id)", &props.app_id),
        ("content type", &props.content_type),
        ("correlation id", &props.correlation_id),
        ("content encoding", &props.content_encoding),
        ("reply_to", &props.reply_to),
        ("expiration", &props.expiration),
        ("user_id", &props.user_id),
        ("cluster_id", &props.cluster_id),
    ] {
        if let Some(v) = v {
            short(what, v)?;
        }
    }
    let size = table(props.headers(), 1)?;
    let total = size
        + [
            &props.message_id,
            &props.kind,
            &props.app_id,
            &props.content_type,
            &props.correlation_id,
            &props.content_encoding,
            &props.reply_to,
            &props.expiration,
            &props.user_id,
            &props.cluster_id,
        ]
        .iter()
        .map(|v| v.as_ref().map_or(0, |s| s.len() + 1))
        .sum::<usize>()
        + 32;
    if total > MAX_PROPERTIES {
        return Err(Error::invalid(format!(
            "the headers and properties are about {total} bytes: they must fit in one AMQP frame ({MAX_PROPERTIES} bytes); \
             send large values in the body"
        )));
    }
    Ok(())
}

/// The encoded size of a table, checking names and depth on the way.
fn table(h: &Headers, depth: usize) -> Result<usize> {
    if depth > MAX_HEADER_DEPTH {
        return Err(Error::invalid(format!(
            "headers nest deeper than {MAX_HEADER_DEPTH} tables: flatten them (a reader's parser recurses once per level)"
        )));
    }
    let mut size = 4;
    for (k, v) in h {
        short("header name", k)?;
        size += 1 + k.len() + value(v, depth)?;
    }
    Ok(size)
}

fn value(v: &Value, depth: usize) -> Result<usize> {
    Ok(1 + match v {
        Value::Null => 0,
        Value::Bool(_) => 1,
        Value::Number(_) => 8,
        Value::String(s) => 4 + s.len(),
        Value::Array(a) => {
            if depth + 1 > MAX_HEADER_DEPTH {
                return Err(Error::invalid(format!(
                    "headers nest deeper than {MAX_HEADER_DEPTH} levels: flatten them (a reader's parser recurses once per level)"
                )));
            }
            4 + a.iter().map(|x| value(x, depth + 1)).sum::<Result<usize>>()?
        }
        Value::Object(o) => table(o, depth + 1)?,
    })
}

/// Make a copy the engine sends (a retry, a dead letter, a replay) fit in
/// one frame. The engine's own headers are small and bounded; what can make
/// a copy too large is the original's own headers, already near the limit
/// when it arrived. Without this the copy is refused, the original put back,
/// and the same happens every second for ever. So the largest application
/// headers are dropped from the copy, their names kept in
/// `x-acemq-dropped-headers`, and the body is kept as it was. The W3C
/// trace context (`traceparent`, `tracestate`) is never among them while it
/// is the size W3C allows: it is what joins the copy to its trace.
pub fn fit_copy(props: &mut Props) {
    if properties(props).is_ok() {
        return;
    }
    let mut droppable: Vec<(usize, String)> = props
        .headers()
        .iter()
        .filter(|(k, v)| !k.starts_with("x-acemq-") && !crate::trace::kept_on_copies(k, v))
        .map(|(k, v)| (k.len() + value(v, 1).unwrap_or(usize::MAX / 2), k.clone()))
        .collect();
    droppable.sort_by(|a, b| b.0.cmp(&a.0));
    // The note naming what was dropped needs room too: its largest size is
    // held while dropping, or a copy that just fits without it would not fit
    // with it.
    const NOTE: &str = "x-acemq-dropped-headers";
    const PREFIX: &str = "too large for one frame: ";
    const NAMES: usize = 1024;
    let earlier = props.headers_mut().insert(NOTE.into(), Value::from(" ".repeat(PREFIX.len() + NAMES)));
    let mut dropped = Vec::new();
    for (_, name) in droppable {
        props.headers_mut().remove(&name);
        dropped.push(name);
        if properties(props).is_ok() {
            break;
        }
    }
    if dropped.is_empty() {
        match earlier {
            Some(note) => props.headers_mut().insert(NOTE.into(), note),
            None => props.headers_mut().remove(NOTE),
        };
    } else {
        let names = bounded(&dropped.join(", "), NAMES);
        props.headers_mut().insert(NOTE.into(), Value::from(format!("{PREFIX}{names}")));
    }
}

/// `text` cut to at most `max` bytes on a character boundary, with a marker
/// saying how much there was, or `text` itself when it fits.
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let marker = format!("... [truncated from {} bytes]", text.len());
    let keep = max.saturating_sub(marker.len());
    format!("{}{marker}", prefix(text, keep))
}

/// The longest prefix of `s` of at most `n` bytes that ends on a character boundary.
fn prefix(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Make `props` those of a copy the engine sends (a retry to a rung, a dead
/// letter, a replay, a dead letter put back at its DLQ's tail). Every
/// property of the original is kept, but:
///
/// - `delivery_mode` is 2: a dead letter exists to be kept, and pika,
///   amqplib and `amqp-publish` publish transient unless told otherwise, so
///   a transient original would otherwise leave a dead letter that a broker
///   restart loses.
/// - `expiration` is left off, and kept in [`ORIGINAL_EXPIRATION_HEADER`]
///   (the first copy's is never overwritten): a per-message TTL said how
///   long the message could wait for a consumer, and it was consumed. Kept,
///   RabbitMQ applies the shorter of it and a rung's TTL, so a rung would
///   give the message back early, and a dead letter would vanish from its
///   DLQ once the TTL ran out, which the DLQ exists to prevent.
/// - a `user_id` RabbitMQ would refuse is moved by the AMQP transport as it
///   sends, not here (it knows its connection's user): see
///   [`ORIGINAL_USER_ID_HEADER`](crate::ORIGINAL_USER_ID_HEADER).
///
/// Then the copy is made to fit in a frame ([`fit_copy`]).
pub(crate) fn copy_props(props: &mut Props) {
    props.delivery_mode = Some(2);
    // A copy goes to a rung or a DLQ by the default exchange: a `CC` left
    // on it (the delay cascade's) would send it to a queue named by it too.
    if props.header("CC").is_some() {
        props.headers_mut().remove("CC");
    }
    if let Some(expiration) = props.expiration.take() {
        let h = props.headers_mut();
        if !h.contains_key(ORIGINAL_EXPIRATION_HEADER) {
            h.insert(ORIGINAL_EXPIRATION_HEADER.into(), Value::from(expiration));
        }
    }
    fit_copy(props);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn names_fit_with_what_the_engine_derives_from_them() {
        assert!(short("routing key", &"k".repeat(255)).is_ok());
        let e = short("routing key", &"k".repeat(256)).unwrap_err();
        assert!(e.to_string().contains("routing key is 256 bytes") && e.is_invalid_argument(), "{e}");
        assert!(queue(&"q".repeat(251)).is_ok());
        let e = queue(&"q".repeat(252)).unwrap_err();
        assert!(e.to_string().contains("dead-letter queue") && e.to_string().contains("251 bytes"), "{e}");
        let policy = RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(300));
        assert!(ladder(&"q".repeat(240), &policy).is_ok());
        assert!(ladder(&"q".repeat(247), &policy).unwrap_err().to_string().contains("retry rung"));
    }

    #[test]
    fn properties_are_checked_as_encoded() {
        let mut p = Props::default();
        p.message_id = Some("é".repeat(128));
        assert!(properties(&p).unwrap_err().to_string().contains("message id is 256 bytes"));
        p.message_id = None;
        p.headers_mut().insert("k".repeat(256), Value::from(1));
        assert!(properties(&p).unwrap_err().to_string().contains("header name"));
        p.headers_mut().clear();
        let mut deep = Value::from(1);
        for _ in 0..40 {
            let mut m = serde_json::Map::new();
            m.insert("x".into(), deep);
            deep = Value::Object(m);
        }
        p.headers_mut().insert("deep".into(), deep);
        assert!(properties(&p).unwrap_err().to_string().contains("nest deeper"));
        p.headers_mut().clear();
        p.headers_mut().insert("big".into(), Value::from("x".repeat(200_000)));
        assert!(properties(&p).unwrap_err().to_string().contains("one AMQP frame"));
    }

    #[test]
    fn a_copy_too_large_for_a_frame_drops_its_largest_application_headers() {
        let mut p = Props::default();
        p.headers_mut().insert("huge".into(), Value::from("x".repeat(MAX_PROPERTIES - 100)));
        p.headers_mut().insert("small".into(), Value::from("kept"));
        p.headers_mut().insert("x-acemq-reason".into(), Value::from("r".repeat(MAX_REASON)));
        fit_copy(&mut p);
        assert!(properties(&p).is_ok());
        assert!(!p.headers().contains_key("huge"));
        assert_eq!(p.headers()["small"], "kept");
        assert!(p.headers()["x-acemq-dropped-headers"].as_str().unwrap().contains("huge"));
        let mut fine = Props::default();
        fine.headers_mut().insert("a".into(), Value::from(1));
        let before = fine.clone();
        fit_copy(&mut fine);
        assert_eq!(fine, before, "a copy that fits is left alone");
    }

    #[test]
    fn a_copy_too_large_keeps_its_trace_context_and_drops_other_headers() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut p = Props::default();
        // Each smaller than the trace headers, so a drop by size alone
        // would take those first.
        for i in 0..4000 {
            p.headers_mut().insert(format!("h{i:04}"), Value::from("y".repeat(30)));
        }
        p.headers_mut().insert("traceparent".into(), Value::from(tp));
        p.headers_mut().insert("tracestate".into(), Value::from("congo=t61rcWkgMzE"));
        fit_copy(&mut p);
        assert!(properties(&p).is_ok());
        assert_eq!(p.headers()["traceparent"], tp);
        assert_eq!(p.headers()["tracestate"], "congo=t61rcWkgMzE");
        // One that is not a trace context by size goes like any other.
        let mut q = Props::default();
        q.headers_mut().insert("traceparent".into(), Value::from("z".repeat(MAX_PROPERTIES)));
        fit_copy(&mut q);
        assert!(properties(&q).is_ok() && !q.headers().contains_key("traceparent"));
    }

    #[test]
    fn reasons_are_cut_on_a_character_boundary_with_a_marker() {
        assert_eq!(bounded("short", 10), "short");
        let long = "ü".repeat(3000);
        let cut = bounded(&long, MAX_REASON);
        assert!(cut.len() <= MAX_REASON && cut.ends_with("[truncated from 6000 bytes]"), "{}", cut.len());
        assert!(cut.starts_with("üü"));
    }
}
