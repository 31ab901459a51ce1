//! The store's rules, written once as async code over the SQL seam: the
//! blocking store runs them on a connection whose statements finish when
//! called (crate::sql::blocking), the async store on one that waits.

use super::letter::{body_bytes, body_text, column_text, cut, short, REASON};
use super::statements::{Statements, INSERT_PARAMS};
use super::{AuditEntry, Counts, DeadLetterStoreOptions, Filter, NewDeadLetter, Page, Retention, Selection, StoredDeadLetter};
use crate::error::{Error, Result};
use crate::sql::values::Columns;

/// The dead-letter table's column readers.
const V: Columns = Columns("dead-letter");
use crate::sql::placeholders::MAX_PARAMS;
use crate::sql::{begin, finish, AsyncSqlConnection, Row, SqlValue};
use serde_json::Value;

/// The most ids in one `IN (...)` list.
const IDS_PER_STATEMENT: usize = 500;
/// The longest page [`Rules::list`] returns.
pub const MAX_PAGE: usize = 1_000;

pub(crate) struct Rules {
    pub(crate) st: Statements,
}

pub(crate) fn now_secs() -> i64 {
    crate::envelope::now_secs() as i64
}

fn opt(s: &Option<String>) -> SqlValue {
    s.as_deref().map(|s| SqlValue::Text(short(s))).unwrap_or(SqlValue::Null)
}

impl Rules {
    pub(crate) fn new(o: &DeadLetterStoreOptions) -> Result<Self> {
        Ok(Rules { st: Statements::new(&o.table, &o.audit_table)? })
    }

    pub(crate) async fn create_schema<C: AsyncSqlConnection + ?Sized>(&self, c: &C) -> Result<()> {
        for sql in self.st.create_schema(c.dialect()) {
            c.execute(&sql, &[]).await?;
        }
        Ok(())
    }

    /// Insert `letters` in one transaction, each new key once; the rows the
    /// database reports inserted.
    pub(crate) async fn insert<C: AsyncSqlConnection + ?Sized>(&self, c: &C, letters: &[NewDeadLetter]) -> Result<u64> {
        if letters.is_empty() {
            return Ok(0);
        }
        let now = now_secs();
        begin(c).await?;
        let result = async {
            let mut n = 0;
            for chunk in letters.chunks(MAX_PARAMS / INSERT_PARAMS) {
                let mut params = Vec::with_capacity(chunk.len() * INSERT_PARAMS);
                for l in chunk {
                    let (body, encoding) = body_text(&l.body);
                    params.extend([
                        SqlValue::Text(short(&l.queue)),
                        SqlValue::Text(short(&l.message_id)),
                        SqlValue::Text(l.content_hash.clone()),
                        SqlValue::Text(body),
                        SqlValue::Text(encoding.to_owned()),
                        SqlValue::Text(Value::Object(l.headers.clone()).to_string()),
                        SqlValue::Text(Value::Object(l.properties.clone()).to_string()),
                        opt(&l.kind),
                        l.reason.as_deref().map(|r| SqlValue::Text(cut(r, REASON))).unwrap_or(SqlValue::Null),
                        opt(&l.error_class),
                        SqlValue::Int(i64::from(l.attempt)),
                        opt(&l.exchange),
                        opt(&l.routing_key),
                        SqlValue::Int(l.failed_at),
                        SqlValue::Int(now),
                        l.history.as_ref().map(|h| SqlValue::Text(h.to_string())).unwrap_or(SqlValue::Null),
                        l.backtrace.as_deref().map(|b| SqlValue::Text(column_text(b))).unwrap_or(SqlValue::Null),
                    ]);
                }
                n += c.execute(&self.st.insert(c.dialect(), chunk.len()), &params).await?;
            }
            Ok(n)
        }
        .await;
        finish(c, result).await
    }

    pub(crate) async fn list<C: AsyncSqlConnection + ?Sized>(&self, c: &C, f: &Filter, after: Option<i64>, limit: usize) -> Result<Page> {
        if limit == 0 || limit > MAX_PAGE {
            return Err(Error::invalid(format!("a page of dead letters holds 1 to {MAX_PAGE} rows; {limit} was asked")));
        }
        let d = c.dialect();
        let (sql, params) = self.st.page_ids(d, f, after, limit + 1);
        let ids = c.query(&sql, &params).await?.iter().map(|r| V.int(V.column(r, 0, "id")?, "id")).collect::<Result<Vec<i64>>>()?;
        let more = ids.len() > limit;
        let ids = &ids[..ids.len().min(limit)];
        let letters = if ids.is_empty() {
            Vec::new()
        } else {
            let params: Vec<SqlValue> = ids.iter().map(|i| SqlValue::Int(*i)).collect();
            c.query(&self.st.rows(d, ids.len()), &params).await?.iter().map(stored).collect::<Result<Vec<_>>>()?
        };
        let next = if more { ids.last().copied() } else { None };
        Ok(Page { letters, next })
    }

    pub(crate) async fn find<C: AsyncSqlConnection + ?Sized>(&self, c: &C, id: i64) -> Result<Option<StoredDeadLetter>> {
        let rows = c.query(&self.st.find(c.dialect()), &[SqlValue::Int(id)]).await?;
        rows.first().map(stored).transpose()
    }

    pub(crate) async fn counts<C: AsyncSqlConnection + ?Sized>(&self, c: &C, f: &Filter, top: usize) -> Result<Counts> {
        use std::collections::HashMap;
        let (sql, params) = self.st.grouped(c.dialect(), f);
        let (mut queues, mut reasons, mut classes) = (HashMap::new(), HashMap::new(), HashMap::new());
        let mut total = 0u64;
        for r in c.query(&sql, &params).await? {
            let queue = V.text(V.column(&r, 0, "queue")?, "queue")?;
            let class = V.opt_text(V.column(&r, 1, "error_class")?, "error_class")?;
            let reason = V.opt_text(V.column(&r, 2, "reason")?, "reason")?;
            let n = V.int(V.column(&r, 3, "COUNT(*)")?, "COUNT(*)")?.max(0) as u64;
            total += n;
            *queues.entry(queue).or_insert(0) += n;
            *classes.entry(class).or_insert(0) += n;
            *reasons.entry(reason).or_insert(0) += n;
        }
        // Most first, then by name, so the order is the same every time.
        fn most<K: Ord>(m: HashMap<K, u64>, top: usize) -> Vec<(K, u64)> {
            let mut v: Vec<(K, u64)> = m.into_iter().collect();
            v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            v.truncate(top);
            v
        }
        let top = top.max(1);
        Ok(Counts { total, by_queue: most(queues, usize::MAX), by_reason: most(reasons, top), by_error_class: most(classes, top) })
    }

    /// The ids a selection names now: a filter's matches at this moment,
    /// lowest first, or the ids given (sorted, each once).
    pub(crate) async fn snapshot<C: AsyncSqlConnection + ?Sized>(&self, c: &C, s: &Selection) -> Result<Vec<i64>> {
        match s {
            Selection::Ids(ids) => {
                let mut ids = ids.clone();
                ids.sort_unstable();
                ids.dedup();
                Ok(ids)
            }
            Selection::Filter(f) => {
                let (sql, params) = self.st.ids(c.dialect(), f);
                c.query(&sql, &params).await?.iter().map(|r| V.int(V.column(r, 0, "id")?, "id")).collect()
            }
        }
    }

    /// Delete rows by id and record it, in one transaction.
    pub(crate) async fn discard<C: AsyncSqlConnection + ?Sized>(&self, c: &C, ids: &[i64], actor: &str) -> Result<u64> {
        begin(c).await?;
        let result = async {
            let mut n = 0;
            // The audit names the queue when every row is of one (ids
            // picked on one DLQ's page).
            let mut queues = std::collections::BTreeSet::new();
            for chunk in ids.chunks(IDS_PER_STATEMENT) {
                let params: Vec<SqlValue> = chunk.iter().map(|i| SqlValue::Int(*i)).collect();
                for row in c.query(&self.st.queues_of_ids(c.dialect(), chunk.len()), &params).await? {
                    queues.insert(V.text(V.column(&row, 0, "queue")?, "queue")?);
                }
                let mut delete = vec![SqlValue::Int(now_secs())];
                delete.extend(params.iter().cloned());
                n += c.execute(&self.st.delete_ids(c.dialect(), chunk.len()), &delete).await?;
            }
            let queue = if queues.len() == 1 { queues.first().map(String::as_str) } else { None };
            self.record(c, actor, "discard", queue, serde_json::json!({ "ids": ids }), n).await?;
            Ok(n)
        }
        .await;
        finish(c, result).await
    }

    /// Delete what `f` matches and record it, in one transaction.
    pub(crate) async fn purge<C: AsyncSqlConnection + ?Sized>(&self, c: &C, f: &Filter, actor: &str) -> Result<u64> {
        begin(c).await?;
        let result = async {
            let (sql, params) = self.st.purge(c.dialect(), f, now_secs());
            let n = c.execute(&sql, &params).await?;
            self.record(c, actor, "purge", f.queue.as_deref(), serde_json::json!({ "filter": f.summary() }), n).await?;
            Ok(n)
        }
        .await;
        finish(c, result).await
    }

    /// Apply `retention` (to `queue`'s rows, or every row), recorded when it
    /// deleted anything.
    pub(crate) async fn prune<C: AsyncSqlConnection + ?Sized>(&self, c: &C, queue: Option<&str>, retention: &Retention, actor: &str) -> Result<u64> {
        if retention.is_off() {
            return Ok(0);
        }
        let d = c.dialect();
        let q: Vec<SqlValue> = queue.map(|q| SqlValue::Text(short(q))).into_iter().collect();
        begin(c).await?;
        let result = async {
            let mut n = 0;
            if let Some(age) = retention.max_age {
                let cutoff = now_secs().saturating_sub(i64::try_from(age.as_secs()).unwrap_or(i64::MAX));
                let mut params = q.clone();
                params.push(SqlValue::Int(cutoff));
                n += c.execute(&self.st.delete_older(d, queue.is_some()), &params).await?;
            }
            if let Some(max) = retention.max_count {
                let mut params = q.clone();
                params.push(SqlValue::Int(i64::try_from(max).unwrap_or(i64::MAX)));
                let rows = c.query(&self.st.nth_newest(d, queue.is_some()), &params).await?;
                if let Some(r) = rows.first() {
                    let through = V.int(V.column(r, 0, "id")?, "id")?;
                    let mut params = q.clone();
                    params.push(SqlValue::Int(through));
                    n += c.execute(&self.st.delete_through(d, queue.is_some()), &params).await?;
                }
            }
            if n > 0 {
                let detail = serde_json::json!({
                    "max_age": retention.max_age.map(|a| a.as_secs()),
                    "max_count": retention.max_count,
                });
                self.record(c, actor, "prune", queue, detail, n).await?;
            }
            Ok(n)
        }
        .await;
        finish(c, result).await
    }

    /// Lease `ids` to replay `run` until `until`, and return those rows it
    /// got (one another replay holds, or gone, is not among them).
    pub(crate) async fn claim<C: AsyncSqlConnection + ?Sized>(&self, c: &C, run: &str, ids: &[i64], until: i64) -> Result<Vec<StoredDeadLetter>> {
        let d = c.dialect();
        let mut out = Vec::new();
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            let mut params = vec![SqlValue::Text(run.to_owned()), SqlValue::Int(until), SqlValue::Int(now_secs())];
            params.extend(chunk.iter().map(|i| SqlValue::Int(*i)));
            c.execute(&self.st.claim(d, chunk.len()), &params).await?;
            let mut params = vec![SqlValue::Text(run.to_owned())];
            params.extend(chunk.iter().map(|i| SqlValue::Int(*i)));
            for r in c.query(&self.st.claimed(d, chunk.len()), &params).await? {
                out.push(stored(&r)?);
            }
        }
        Ok(out)
    }

    /// Delete rows replay `run` sent (confirmed).
    pub(crate) async fn delete_sent<C: AsyncSqlConnection + ?Sized>(&self, c: &C, run: &str, ids: &[i64]) -> Result<u64> {
        self.by_run(c, run, ids, true).await
    }

    /// Give back rows replay `run` leased and did not send.
    pub(crate) async fn release<C: AsyncSqlConnection + ?Sized>(&self, c: &C, run: &str, ids: &[i64]) -> Result<u64> {
        self.by_run(c, run, ids, false).await
    }

    async fn by_run<C: AsyncSqlConnection + ?Sized>(&self, c: &C, run: &str, ids: &[i64], delete: bool) -> Result<u64> {
        let mut n = 0;
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            let mut params = vec![SqlValue::Text(run.to_owned())];
            params.extend(chunk.iter().map(|i| SqlValue::Int(*i)));
            let sql = if delete { self.st.delete_claimed(c.dialect(), chunk.len()) } else { self.st.release(c.dialect(), chunk.len()) };
            n += c.execute(&sql, &params).await?;
        }
        Ok(n)
    }

    /// Write one audit row.
    pub(crate) async fn record<C: AsyncSqlConnection + ?Sized>(
        &self,
        c: &C,
        actor: &str,
        action: &str,
        queue: Option<&str>,
        detail: Value,
        affected: u64,
    ) -> Result<()> {
        let params = [
            SqlValue::Int(now_secs()),
            SqlValue::Text(short(actor)),
            SqlValue::Text(action.to_owned()),
            queue.map(|q| SqlValue::Text(short(q))).unwrap_or(SqlValue::Null),
            SqlValue::Text(detail.to_string()),
            SqlValue::Int(i64::try_from(affected).unwrap_or(i64::MAX)),
        ];
        c.execute(&self.st.audit_insert(c.dialect()), &params).await.map(drop)
    }

    pub(crate) async fn audit<C: AsyncSqlConnection + ?Sized>(&self, c: &C, limit: usize) -> Result<Vec<AuditEntry>> {
        let rows = c.query(&self.st.audit_list(c.dialect()), &[SqlValue::Int(limit.min(MAX_PAGE) as i64)]).await?;
        rows.iter()
            .map(|r| {
                let detail = V.text(V.column(r, 5, "detail")?, "detail")?;
                Ok(AuditEntry {
                    id: V.int(V.column(r, 0, "id")?, "id")?,
                    at: V.int(V.column(r, 1, "created_at")?, "created_at")?,
                    actor: V.text(V.column(r, 2, "actor")?, "actor")?,
                    action: V.text(V.column(r, 3, "action")?, "action")?,
                    queue: V.opt_text(V.column(r, 4, "queue")?, "queue")?,
                    detail: serde_json::from_str(&detail).unwrap_or(Value::String(detail)),
                    count: V.int(V.column(r, 6, "affected")?, "affected")?.max(0) as u64,
                })
            })
            .collect()
    }
}

/// JSON text from a column: parsed, or kept as a string when it does not
/// parse (a row edited by hand reads as what it holds, never an error).
fn json(text: Option<String>) -> Option<Value> {
    text.map(|t| serde_json::from_str(&t).unwrap_or(Value::String(t)))
}

fn object(text: String) -> serde_json::Map<String, Value> {
    match serde_json::from_str(&text) {
        Ok(Value::Object(m)) => m,
        _ => {
            let mut m = serde_json::Map::new();
            m.insert("x-acemq-unreadable".into(), Value::String(text));
            m
        }
    }
}

/// A row of [`COLUMNS`](super::statements::COLUMNS).
pub(crate) fn stored(r: &Row) -> Result<StoredDeadLetter> {
    let t = |i: usize, name: &str| V.text(V.column(r, i, name)?, name);
    let o = |i: usize, name: &str| V.opt_text(V.column(r, i, name)?, name);
    let int = |i: usize, name: &str| V.int(V.column(r, i, name)?, name);
    Ok(StoredDeadLetter {
        id: int(0, "id")?,
        ingested_at: int(15, "ingested_at")?,
        letter: NewDeadLetter {
            queue: t(1, "queue")?,
            message_id: t(2, "message_id")?,
            content_hash: t(3, "content_hash")?,
            body: body_bytes(t(4, "body")?, &t(5, "body_encoding")?)?,
            headers: object(t(6, "headers")?),
            properties: object(t(7, "properties")?),
            kind: o(8, "message_type")?,
            reason: o(9, "reason")?,
            error_class: o(10, "error_class")?,
            attempt: u32::try_from(int(11, "attempt")?.max(0)).unwrap_or(u32::MAX),
            exchange: o(12, "exchange")?,
            routing_key: o(13, "routing_key")?,
            failed_at: int(14, "failed_at")?,
            history: json(o(16, "history")?),
            backtrace: o(17, "backtrace")?,
        },
    })
}

