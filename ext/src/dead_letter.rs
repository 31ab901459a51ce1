//! AceMQ::AMQP::Connection::DeadLetter: core's `DeadLetter` (one message in
//! a DLQ, left in place) with named readers, what
//! `Connection#peek_dead_letters` makes its hashes from; and the two
//! answers about a DLQ as a whole, `DeadLetterPage` (one page browsed) and
//! `ReplayReport` (how many were moved or removed, how many skipped).

use acemq::{DeadLetter, DeadLetterPage, ReplayReport};
use magnus::{method, prelude::*, Error, RArray, RClass, RString, Ruby, Value};

#[magnus::wrap(class = "AceMQ::AMQP::Connection::DeadLetter", free_immediately, size)]
pub struct RbDeadLetter(pub(crate) DeadLetter);

impl RbDeadLetter {
    fn id(&self) -> String {
        self.0.id.clone()
    }

    fn kind(&self) -> Option<String> {
        self.0.kind.clone()
    }

    /// Attempts made before it was dead-lettered.
    fn attempt(&self) -> u32 {
        self.0.attempt
    }

    fn reason(&self) -> Option<String> {
        self.0.reason.clone()
    }

    fn error_class(&self) -> Option<String> {
        self.0.error_class.clone()
    }

    /// Where the failure happened (`x-acemq-backtrace`): its first frames,
    /// one a line, bounded by the engine that wrote it; nil when the failure
    /// had none (a retry or reject asked for with an Ack, a timeout, a
    /// message that was not JSON) or the header is not text.
    fn backtrace(&self) -> Option<String> {
        self.0.headers.get(acemq::BACKTRACE_HEADER).and_then(|v| v.as_str()).map(str::to_owned)
    }

    /// Seconds since the epoch; nil when the header is missing.
    fn failed_at(&self) -> Option<u64> {
        self.0.failed_at
    }

    /// The body as it arrived, a binary String.
    fn body(ruby: &Ruby, rb_self: &Self) -> RString {
        ruby.str_from_slice(&rb_self.0.body)
    }

    fn exchange(&self) -> Option<String> {
        self.0.exchange.clone()
    }

    fn routing_key(&self) -> Option<String> {
        self.0.routing_key.clone()
    }

    /// Every header, a new Hash (names to JSON values, as a consumed
    /// message's).
    fn headers(ruby: &Ruby, rb_self: &Self) -> Result<Value, Error> {
        crate::json::map_to_ruby(ruby, &rb_self.0.headers)
    }
}

/// One page of a DLQ browsed, left in place.
#[magnus::wrap(class = "AceMQ::AMQP::Connection::DeadLetterPage", free_immediately, size)]
pub struct RbDeadLetterPage(pub(crate) DeadLetterPage);

impl RbDeadLetterPage {
    /// The page's dead letters, oldest first: a new Array of DeadLetter.
    fn letters(ruby: &Ruby, rb_self: &Self) -> Result<RArray, Error> {
        let out = ruby.ary_new_capa(rb_self.0.letters.len());
        for d in &rb_self.0.letters {
            out.push(RbDeadLetter(d.clone()))?;
        }
        Ok(out)
    }

    /// Messages looked at to fill it (the skipped and the filtered out too).
    fn scanned(&self) -> usize {
        self.0.scanned
    }

    fn more(&self) -> bool {
        self.0.more
    }

    /// How far the DLQ rotated while it was read (see browse_dead_letters).
    fn moved(&self) -> usize {
        self.0.moved
    }

    fn partial(&self) -> bool {
        self.0.partial
    }
}

/// What a replay or a discard did.
#[magnus::wrap(class = "AceMQ::AMQP::Connection::ReplayReport", free_immediately, size)]
pub struct RbReplayReport(pub(crate) ReplayReport);

impl RbReplayReport {
    /// Replayed (or, by a discard, removed).
    fn moved(&self) -> usize {
        self.0.replayed
    }

    /// Matched the filter but left where they were (see replay_dead_letters).
    fn skipped(&self) -> usize {
        self.0.skipped
    }
}

pub fn init(ruby: &Ruby, connection: RClass) -> Result<(), Error> {
    let class = connection.define_class("DeadLetter", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_method("id", method!(RbDeadLetter::id, 0))?;
    class.define_method("type", method!(RbDeadLetter::kind, 0))?;
    class.define_method("attempt", method!(RbDeadLetter::attempt, 0))?;
    class.define_method("reason", method!(RbDeadLetter::reason, 0))?;
    class.define_method("error_class", method!(RbDeadLetter::error_class, 0))?;
    class.define_method("backtrace", method!(RbDeadLetter::backtrace, 0))?;
    class.define_method("failed_at", method!(RbDeadLetter::failed_at, 0))?;
    class.define_method("body", method!(RbDeadLetter::body, 0))?;
    class.define_method("exchange", method!(RbDeadLetter::exchange, 0))?;
    class.define_method("routing_key", method!(RbDeadLetter::routing_key, 0))?;
    class.define_method("headers", method!(RbDeadLetter::headers, 0))?;
    let page = connection.define_class("DeadLetterPage", ruby.class_object())?;
    page.undef_default_alloc_func();
    page.define_method("letters", method!(RbDeadLetterPage::letters, 0))?;
    page.define_method("scanned", method!(RbDeadLetterPage::scanned, 0))?;
    page.define_method("more?", method!(RbDeadLetterPage::more, 0))?;
    page.define_method("moved", method!(RbDeadLetterPage::moved, 0))?;
    page.define_method("partial?", method!(RbDeadLetterPage::partial, 0))?;
    let report = connection.define_class("ReplayReport", ruby.class_object())?;
    report.undef_default_alloc_func();
    report.define_method("moved", method!(RbReplayReport::moved, 0))?;
    report.define_method("skipped", method!(RbReplayReport::skipped, 0))?;
    Ok(())
}
