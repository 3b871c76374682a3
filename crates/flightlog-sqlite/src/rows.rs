//! Decoding stored rows into the core's records: the one place that knows the column order.

use flightlog_core::activity::{
    JsonObject, RunRollupRow, SpanEventRow, SpanKind, SpanOrigin, SpanOutcome, SpanRow, SpanUsage,
};
use std::collections::HashMap;
use std::sync::RwLock;

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSqlOutput, Type, ValueRef};
use rusqlite::ToSql;
use rusqlite::{Connection, Row};

use crate::payload_codec::PayloadCodec;
use serde_json::value::RawValue;

/// The span columns every span read selects, in [`span_from_row`]'s order, from
/// `activity_spans s`. Run ids and writer names come from [`KeyNames`], not from joins.
pub(crate) const SPAN_COLUMNS: &str = "s.span_id, s.run_key, s.parent_span_id, s.name, s.kind, \
     s.origin, s.session_id, s.job_name, s.attrs, s.started_at, s.wait_until, s.ended_at, \
     s.outcome, s.outcome_reason, s.input_tokens, s.output_tokens, s.cache_read_tokens, \
     s.cache_creation_tokens, s.cost_usd, s.model, s.writer_key, s.last_heartbeat_at";

/// Run ids and writer names by surrogate key. Those rows are never changed or deleted, so once
/// read they are cached, sparing every span read two joins.
///
/// Each cache is emptied when it reaches [`KeyNames::MAX_ENTRIES`] names or
/// [`KeyNames::MAX_BYTES`] of them (a miss costs one primary-key lookup). The bound used to be a
/// million entries whatever their length: reading the changes of 160,000 runs with 200-byte ids
/// once took the server from 56 to 102 MB, and a long-running server reading ever new runs
/// would have grown to about 290 MB before the first clear (a soak audit's finding).
#[derive(Debug, Default)]
pub(crate) struct KeyNames {
    runs: RwLock<NameCache>,
    writers: RwLock<NameCache>,
}

/// One [`KeyNames`] cache: names by key, and the bytes they hold.
#[derive(Debug, Default)]
struct NameCache {
    names: HashMap<i64, String>,
    bytes: usize,
}

impl KeyNames {
    /// The most names a cache holds (the writer's caches stop at the same count).
    const MAX_ENTRIES: usize = 65_536;
    /// The most bytes of names (plus a map entry's overhead each) a cache holds.
    const MAX_BYTES: usize = 8 << 20;
    /// What a map entry costs beside its name's bytes: key, `String` header, hash slot.
    const ENTRY_OVERHEAD: usize = 48;

    fn lookup(
        cache: &RwLock<NameCache>,
        conn: &Connection,
        sql: &str,
        key: i64,
    ) -> rusqlite::Result<String> {
        if let Some(name) = cache
            .read()
            .ok()
            .and_then(|cache| cache.names.get(&key).cloned())
        {
            return Ok(name);
        }
        let name: String = conn
            .prepare_cached(sql)?
            .query_row([key], |row| row.get(0))?;
        if let Ok(mut cache) = cache.write() {
            let cost = name.len() + Self::ENTRY_OVERHEAD;
            if cache.names.len() >= Self::MAX_ENTRIES || cache.bytes + cost > Self::MAX_BYTES {
                cache.names = HashMap::new();
                cache.bytes = 0;
            }
            if cache.names.insert(key, name.clone()).is_none() {
                cache.bytes += cost;
            }
        }
        Ok(name)
    }

    /// The run id of `run_key`.
    pub fn run_id(&self, conn: &Connection, run_key: i64) -> rusqlite::Result<String> {
        Self::lookup(
            &self.runs,
            conn,
            "SELECT run_id FROM activity_runs WHERE run_key = ?1",
            run_key,
        )
    }

    /// The writer identity of `writer_key`.
    pub fn writer(&self, conn: &Connection, writer_key: i64) -> rusqlite::Result<String> {
        Self::lookup(
            &self.writers,
            conn,
            "SELECT writer FROM activity_writers WHERE writer_key = ?1",
            writer_key,
        )
    }
}

/// Number of columns in [`SPAN_COLUMNS`].
pub(crate) const SPAN_COLUMN_COUNT: usize = 22;

/// Parse stored attrs; anything unreadable reads as `{}` (the reference's `safeParse ?? {}`).
pub(crate) fn parse_attrs(text: Option<&str>) -> JsonObject {
    text.and_then(|text| flightlog_core::json_as_written::object_from_str(text).ok())
        .unwrap_or_default()
}

/// A span's `attrs` column as stored: JSON text, or packed with the database's dictionary
/// (see [`PayloadCodec::pack_attrs`]). A write that keeps the attrs passes them on as they are.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StoredAttrs {
    Text(String),
    Packed(Vec<u8>),
}

impl StoredAttrs {
    /// `json` as it is best stored: packed when that makes it smaller.
    pub fn pack(json: String, codec: &PayloadCodec) -> Self {
        match codec.pack_attrs(&json) {
            Some(packed) => Self::Packed(packed),
            None => Self::Text(json),
        }
    }

    /// The attrs' JSON text; `None` when packed attrs cannot be unpacked (they then read as
    /// `{}`, as unreadable text does).
    pub fn into_text(self, codec: &PayloadCodec, conn: &Connection) -> Option<String> {
        match self {
            Self::Text(text) => Some(text),
            Self::Packed(packed) => codec.unpack_attrs(conn, &packed).ok(),
        }
    }
}

impl FromSql for StoredAttrs {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        match value {
            ValueRef::Text(text) => String::from_utf8(text.to_vec())
                .map(Self::Text)
                .map_err(|err| FromSqlError::Other(Box::new(err))),
            ValueRef::Blob(packed) => Ok(Self::Packed(packed.to_vec())),
            _ => Err(FromSqlError::InvalidType),
        }
    }
}

impl ToSql for StoredAttrs {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Self::Text(text) => ValueRef::Text(text.as_bytes()),
            Self::Packed(packed) => ValueRef::Blob(packed),
        }))
    }
}

/// The attrs of a span row's `attrs` column (text, packed or NULL). Attrs that cannot be read
/// back read as `{}`, packed or not (the reference's `safeParse ?? {}`): a damaged value must not
/// make its span, its run and every change-log page through it unreadable.
fn attrs_from_row(
    row: &Row<'_>,
    column: usize,
    codec: &PayloadCodec,
    conn: &Connection,
) -> rusqlite::Result<JsonObject> {
    Ok(match row.get_ref(column)? {
        ValueRef::Blob(packed) => parse_attrs(codec.unpack_attrs(conn, packed).ok().as_deref()),
        ValueRef::Text(text) => parse_attrs(std::str::from_utf8(text).ok()),
        _ => JsonObject::default(),
    })
}

/// Decode a span from `row`, starting at column `base`.
pub(crate) fn span_from_row(
    row: &Row<'_>,
    base: usize,
    names: &KeyNames,
    codec: &PayloadCodec,
    conn: &Connection,
) -> rusqlite::Result<SpanRow> {
    let kind: String = row.get(base + 4)?;
    let origin: String = row.get(base + 5)?;
    let outcome: Option<String> = row.get(base + 12)?;
    Ok(SpanRow {
        span_id: row.get(base)?,
        run_id: names.run_id(conn, row.get(base + 1)?)?,
        parent_span_id: row.get(base + 2)?,
        name: row.get(base + 3)?,
        kind: SpanKind::from_stored(&kind),
        origin: SpanOrigin::from_stored(&origin),
        session_id: row.get(base + 6)?,
        job_name: row.get(base + 7)?,
        attrs: attrs_from_row(row, base + 8, codec, conn)?,
        started_at: row.get(base + 9)?,
        wait_until: row.get(base + 10)?,
        ended_at: row.get(base + 11)?,
        outcome: outcome.as_deref().map(SpanOutcome::from_stored),
        outcome_reason: row.get(base + 13)?,
        usage: SpanUsage {
            input_tokens: row.get(base + 14)?,
            output_tokens: row.get(base + 15)?,
            cache_read_tokens: row.get(base + 16)?,
            cache_creation_tokens: row.get(base + 17)?,
            cost_usd: row.get(base + 18)?,
            model: row.get(base + 19)?,
        },
        writer: names.writer(conn, row.get(base + 20)?)?,
        last_heartbeat_at: row.get(base + 21)?,
    })
}

/// The event columns, in [`event_from_row`]'s order; callers join `activity_events e` and
/// `activity_spans s`.
pub(crate) const EVENT_COLUMNS: &str = "s.span_id, e.event_index, e.ts, e.event_type, e.payload, \
     e.truncated, e.dict_id";

/// The payload JSON stored in columns `payload_column` (text or zstd frame) and `dict_column`.
pub(crate) fn payload_from_row(
    row: &Row<'_>,
    payload_column: usize,
    dict_column: usize,
    codec: &PayloadCodec,
    conn: &Connection,
) -> rusqlite::Result<Box<RawValue>> {
    let dict_id: Option<i64> = row.get(dict_column)?;
    let conversion = |err: Box<dyn std::error::Error + Send + Sync>| {
        rusqlite::Error::FromSqlConversionFailure(payload_column, Type::Text, err)
    };
    let json = codec
        .decode(conn, dict_id, row.get_ref(payload_column)?)
        .map_err(|err| conversion(Box::new(err)))?;
    RawValue::from_string(json).map_err(|err| conversion(Box::new(err)))
}

/// Decode an event from `row`, starting at column `base`.
pub(crate) fn event_from_row(
    row: &Row<'_>,
    base: usize,
    codec: &PayloadCodec,
    conn: &Connection,
) -> rusqlite::Result<SpanEventRow> {
    Ok(SpanEventRow {
        span_id: row.get(base)?,
        event_index: row.get(base + 1)?,
        ts: row.get(base + 2)?,
        event_type: row.get(base + 3)?,
        payload: payload_from_row(row, base + 4, base + 6, codec, conn)?,
        truncated: row.get::<_, i64>(base + 5)? != 0,
    })
}

/// The rollup columns, in [`rollup_from_row`]'s order; callers join `activity_run_rollups o`
/// and `activity_runs r`.
pub(crate) const ROLLUP_COLUMNS: &str = "r.run_id, o.origin, o.name, o.session_id, o.job_name, \
     o.started_at, o.ended_at, o.outcome, o.duration_ms, o.span_count, o.input_tokens, \
     o.output_tokens, o.cache_read_tokens, o.cache_creation_tokens, o.cost_usd, \
     o.failure_reason, o.detail_pruned";

/// Decode a rollup row.
pub(crate) fn rollup_from_row(row: &Row<'_>) -> rusqlite::Result<RunRollupRow> {
    let origin: String = row.get(1)?;
    let outcome: Option<String> = row.get(7)?;
    Ok(RunRollupRow {
        run_id: row.get(0)?,
        origin: SpanOrigin::from_stored(&origin),
        name: row.get(2)?,
        session_id: row.get(3)?,
        job_name: row.get(4)?,
        started_at: row.get(5)?,
        ended_at: row.get(6)?,
        outcome: outcome.as_deref().map(SpanOutcome::from_stored),
        duration_ms: row.get(8)?,
        span_count: row.get(9)?,
        input_tokens: row.get(10)?,
        output_tokens: row.get(11)?,
        cache_read_tokens: row.get(12)?,
        cache_creation_tokens: row.get(13)?,
        cost_usd: row.get(14)?,
        failure_reason: row.get(15)?,
        detail_pruned: row.get::<_, i64>(16)? != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run-id cache stays within its bounds in bytes and in names, and still answers every
    /// lookup right after it is emptied.
    #[test]
    fn the_name_caches_stay_within_their_bounds() {
        let conn = Connection::open_in_memory().expect("an in-memory database");
        conn.execute_batch("CREATE TABLE activity_runs (run_key INTEGER PRIMARY KEY, run_id TEXT)")
            .expect("the table");
        let long = "r".repeat(64 * 1024);
        for key in 0..300_i64 {
            conn.execute(
                "INSERT INTO activity_runs VALUES (?1, ?2)",
                rusqlite::params![key, format!("{key}-{long}")],
            )
            .expect("a run");
        }
        let names = KeyNames::default();
        for round in 0..2 {
            for key in 0..300_i64 {
                let name = names.run_id(&conn, key).expect("the run id");
                assert!(name.starts_with(&format!("{key}-")), "round {round}");
                let cache = names.runs.read().expect("the cache");
                assert!(cache.bytes <= KeyNames::MAX_BYTES, "{} bytes", cache.bytes);
                assert!(cache.names.len() <= KeyNames::MAX_ENTRIES);
                let held: usize = cache
                    .names
                    .values()
                    .map(|name| name.len() + KeyNames::ENTRY_OVERHEAD)
                    .sum();
                assert_eq!(held, cache.bytes, "the count of bytes is exact");
            }
        }
        // Short names: bounded by their number.
        conn.execute_batch("DELETE FROM activity_runs")
            .expect("emptied");
        for key in 0..(KeyNames::MAX_ENTRIES as i64 + 10) {
            conn.execute(
                "INSERT INTO activity_runs VALUES (?1, ?2)",
                rusqlite::params![key, format!("run-{key}")],
            )
            .expect("a run");
        }
        let names = KeyNames::default();
        for key in 0..(KeyNames::MAX_ENTRIES as i64 + 10) {
            assert_eq!(
                names.run_id(&conn, key).expect("the run id"),
                format!("run-{key}")
            );
        }
        let cache = names.runs.read().expect("the cache");
        assert!(cache.names.len() <= KeyNames::MAX_ENTRIES);
    }
}
