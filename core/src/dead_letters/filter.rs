//! What an operator asks of the store: which dead letters (a filter), one
//! page of them, their counts, and the record of what was done to them.

use super::StoredDeadLetter;

/// Which dead letters. Every field left `None` matches all; those set must
/// all hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// The work queue (not its `.dlq`).
    pub queue: Option<String>,
    /// The reason contains this text, case-blind: for ASCII letters on
    /// SQLite; on PostgreSQL (`ILIKE`) as its locale folds case; on MySQL
    /// and MariaDB in `utf8mb4_general_ci`, which also takes `e` for `é`.
    pub reason: Option<String>,
    /// The error class is this one.
    pub error_class: Option<String>,
    /// The message type is this one.
    pub kind: Option<String>,
    /// The message id is this one.
    pub message_id: Option<String>,
    /// Failed at or after this, seconds since the epoch.
    pub since: Option<i64>,
    /// Failed before this, seconds since the epoch.
    pub before: Option<i64>,
}

impl Filter {
    /// Every dead letter of `queue`.
    pub fn queue(queue: impl Into<String>) -> Filter {
        Filter { queue: Some(queue.into()), ..Filter::default() }
    }

    /// Whether nothing is set (it matches every row). A text that is
    /// blank counts as not set.
    pub fn is_empty(&self) -> bool {
        self.normalized() == Filter::default()
    }

    /// The filter with every blank text (empty, or whitespace alone) taken
    /// as not set: what an empty form field sends means "any", never "a
    /// reason containing nothing", which is every row. Every read and
    /// action of the store applies it.
    pub fn normalized(&self) -> Filter {
        let text = |v: &Option<String>| v.as_ref().filter(|t| !t.trim().is_empty()).cloned();
        Filter {
            queue: text(&self.queue),
            reason: text(&self.reason),
            error_class: text(&self.error_class),
            kind: text(&self.kind),
            message_id: text(&self.message_id),
            since: self.since,
            before: self.before,
        }
    }

    /// The filter as JSON, for the audit table.
    pub(crate) fn summary(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        let mut put = |k: &str, v: Option<serde_json::Value>| {
            if let Some(v) = v {
                m.insert(k.to_owned(), v);
            }
        };
        put("queue", self.queue.clone().map(Into::into));
        put("reason", self.reason.clone().map(Into::into));
        put("error_class", self.error_class.clone().map(Into::into));
        put("type", self.kind.clone().map(Into::into));
        put("message_id", self.message_id.clone().map(Into::into));
        put("since", self.since.map(Into::into));
        put("before", self.before.map(Into::into));
        serde_json::Value::Object(m)
    }
}

/// One page of [`list`](crate::dead_letters::SqlDeadLetterStore::list):
/// newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// The rows, newest (highest id) first.
    pub letters: Vec<StoredDeadLetter>,
    /// The cursor of the next page (`after_id`), when there is one: the
    /// last row's id. Rows that arrive meanwhile have higher ids and never
    /// shift a page, so no row is shown twice or skipped.
    pub next: Option<i64>,
}

/// How many dead letters match a filter, and how they group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// All matching rows.
    pub total: u64,
    /// Per queue, most first.
    pub by_queue: Vec<(String, u64)>,
    /// Per reason (None: none given), most first, at most the `top` asked.
    pub by_reason: Vec<(Option<String>, u64)>,
    /// Per error class, most first, at most the `top` asked.
    pub by_error_class: Vec<(Option<String>, u64)>,
}

/// What a replay, discard or purge is given: rows by id, or every row a
/// filter matches at the moment it is called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// These rows (ids that are gone by then are counted as missing).
    Ids(Vec<i64>),
    /// What matches, when the call is made.
    Filter(Filter),
}

impl Selection {
    pub(crate) fn summary(&self) -> serde_json::Value {
        match self {
            Selection::Ids(ids) => serde_json::json!({ "ids": ids }),
            Selection::Filter(f) => serde_json::json!({ "filter": f.summary() }),
        }
    }

    /// Whether a replay may take this selection: a filter that sets
    /// nothing (blank texts count as unset) would replay every dead
    /// letter of every queue, so it is refused, as a purge's is.
    pub fn check_for_replay(&self) -> crate::Result<()> {
        match self {
            Selection::Filter(f) if f.is_empty() => Err(crate::error::Error::invalid(
                "replay without a filter would replay every dead letter of every queue: name a queue (and a reason, a type, ...) or the ids",
            )),
            _ => Ok(()),
        }
    }

    /// The queue a filter names (none for ids): what the audit row shows.
    pub fn queue(&self) -> Option<&str> {
        match self {
            Selection::Ids(_) => None,
            Selection::Filter(f) => f.queue.as_deref(),
        }
    }
}

/// One row of the audit table.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    /// Row id, newest highest.
    pub id: i64,
    /// When, seconds since the epoch.
    pub at: i64,
    /// Who, as the caller named them.
    pub actor: String,
    /// `replay`, `discard`, `purge` or `prune`.
    pub action: String,
    /// The queue, when the action named one.
    pub queue: Option<String>,
    /// What was asked (ids, filter, the replay's id and rate), as JSON.
    pub detail: serde_json::Value,
    /// How many rows it took.
    pub count: u64,
}
