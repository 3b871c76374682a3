//! `write_batch`: a whole batch of span writes as ONE job of the writer thread.
//!
//! Queued one by one, each write of a batch would pay a queue round trip and a wake-up, and the
//! batch could never be faster than the writer's latency times its length. As one job it costs
//! one round trip, and the writes still apply in order, each atomic on its own: a write that
//! fails is rolled back alone (its neighbours keep their effects; see [`apply_batch`] for how
//! that stays cheap). After such a rollback the writer's caches are cleared, because the
//! rolled-back write may have cached keys or counters that no longer exist.
//!
//! Capping and compressing event payloads happens before the job is queued, on the caller's
//! thread, as for a single `append_event`.

use flightlog_core::activity::{
    cap_payload, ActivityWrite, ActivityWriteResult, CappedPayload, StartSpanInput, StoreError,
};
use flightlog_core::json_depth;

use crate::activity_write as write;
use crate::database::{fails_cleanly, WriteContext};
use crate::error::backend;
use crate::payload_codec::{CompressedPayload, PayloadCodec};
use crate::rows::StoredAttrs;

/// One write of the batch with its CPU work done.
pub(crate) enum PreparedWrite {
    /// Refused before the job (its input cannot be stored; see [`check_input`]): it fails alone,
    /// cleanly, in its place in the order.
    Refused(String),
    /// Everything but an event append or a span start: applied as given.
    Plain(ActivityWrite),
    /// A span start with its attrs serialized and packed.
    StartSpan {
        input: StartSpanInput,
        attrs: Option<StoredAttrs>,
    },
    AppendEvent {
        span_id: String,
        event_type: String,
        payload: CappedPayload,
        compressed: Option<CompressedPayload>,
        ts: i64,
    },
}

/// Cap and compress the payloads of the batch's appends (`now` is the default event time).
pub(crate) fn prepare(
    writes: Vec<ActivityWrite>,
    codec: &PayloadCodec,
    now: i64,
) -> Vec<PreparedWrite> {
    writes
        .into_iter()
        .map(|write| match check_input(&write) {
            Err(message) => PreparedWrite::Refused(message),
            Ok(()) => prepare_one(write, codec, now),
        })
        .collect()
}

/// The input checks every write path of the store applies before queueing (the same as the
/// single calls'): stored attrs and payloads nest at most `MAX_JSON_DEPTH` levels.
pub(crate) fn check_input(write: &ActivityWrite) -> Result<(), String> {
    match write {
        ActivityWrite::StartSpan(input) => json_depth::check_object("attrs", input.attrs.as_ref()),
        ActivityWrite::EndSpan { input, .. } => {
            json_depth::check_object("attrs", input.attrs.as_ref())
        }
        ActivityWrite::PatchSpan { patch, .. } => {
            json_depth::check_object("attrs", patch.attrs.as_ref())
        }
        ActivityWrite::AppendEvent { payload, .. } => {
            json_depth::check_value("payload", payload.as_ref())
        }
        // Read within the limit (see `PayloadText`).
        ActivityWrite::AppendEventText { .. } | ActivityWrite::Heartbeat { .. } => Ok(()),
    }
}

fn prepare_one(write: ActivityWrite, codec: &PayloadCodec, now: i64) -> PreparedWrite {
    match write {
        ActivityWrite::AppendEvent {
            span_id,
            event_type,
            payload,
            ts,
        } => prepare_event(
            span_id,
            event_type,
            cap_payload(payload.as_ref()),
            ts,
            codec,
            now,
        ),
        ActivityWrite::AppendEventText {
            span_id,
            event_type,
            payload,
            ts,
        } => prepare_event(span_id, event_type, payload.into_capped(), ts, codec, now),
        ActivityWrite::StartSpan(input) => {
            let attrs = write::stored_attrs(input.attrs.as_ref(), codec);
            PreparedWrite::StartSpan { input, attrs }
        }
        other => PreparedWrite::Plain(other),
    }
}

/// An event ready for the writer: its payload compressed here, on the request's thread.
fn prepare_event(
    span_id: String,
    event_type: String,
    payload: CappedPayload,
    ts: Option<i64>,
    codec: &PayloadCodec,
    now: i64,
) -> PreparedWrite {
    let compressed = codec.encode(&payload.json);
    PreparedWrite::AppendEvent {
        span_id,
        event_type,
        payload,
        compressed,
        ts: ts.unwrap_or(now),
    }
}

fn apply_one(
    ctx: &mut WriteContext<'_>,
    prepared: &PreparedWrite,
    writer: &str,
    now: i64,
) -> Result<ActivityWriteResult, StoreError> {
    match prepared {
        PreparedWrite::Refused(message) => Err(StoreError::InvalidInput(message.clone())),
        PreparedWrite::StartSpan { input, attrs } => {
            write::start_span(ctx, input, attrs.as_ref(), writer, now)
                .map(|span| ActivityWriteResult::Started(Box::new(span)))
        }
        PreparedWrite::Plain(ActivityWrite::StartSpan(_)) => Err(StoreError::Backend(
            "a span start reached the batch job unprepared".to_owned(),
        )),
        PreparedWrite::Plain(ActivityWrite::EndSpan { span_id, input }) => {
            write::end_span(ctx, span_id, input, now).map(ActivityWriteResult::Ended)
        }
        PreparedWrite::Plain(ActivityWrite::PatchSpan { span_id, patch }) => {
            write::patch_span(ctx, span_id, patch).map(ActivityWriteResult::Patched)
        }
        PreparedWrite::Plain(ActivityWrite::Heartbeat { span_id, at }) => {
            write::heartbeat(ctx, span_id, at.unwrap_or(now))
                .map(|()| ActivityWriteResult::Heartbeat)
        }
        PreparedWrite::Plain(
            ActivityWrite::AppendEvent { .. } | ActivityWrite::AppendEventText { .. },
        ) => Err(StoreError::Backend(
            "an event append reached the batch job unprepared".to_owned(),
        )),
        PreparedWrite::AppendEvent {
            span_id,
            event_type,
            payload,
            compressed,
            ts,
        } => write::append_event(ctx, span_id, event_type, payload, compressed.as_ref(), *ts)
            .map(ActivityWriteResult::Appended),
    }
}

fn exec(ctx: &WriteContext<'_>, sql: &str) -> Result<(), StoreError> {
    ctx.conn
        .prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute([]))
        .map(|_| ())
        .map_err(backend)
}

/// The job. Fast path: the writes run back to back with no savepoint at all, as the writer
/// runs single writes (a failed statement undoes itself in SQLite, and a clean failure wrote
/// nothing). A savepoint around the batch cost the writer a copy of every page the batch touched
/// into SQLite's statement journal (spilling to a temporary file past 64 KiB): measured at
/// 15 – 30% of the writer thread's time in the HTTP batch benchmark. If a write fails dirty, the
/// job fails dirty too, the writer rolls the whole group back and replays it with a savepoint
/// around each job (`ctx.isolated`), and in that replay the batch puts one around each of its
/// writes, so only the failing write fails. Only a failing savepoint statement fails the
/// replayed job.
pub(crate) fn apply_batch(
    ctx: &mut WriteContext<'_>,
    writes: &[PreparedWrite],
    writer: &str,
    now: i64,
) -> Result<Vec<Result<ActivityWriteResult, StoreError>>, StoreError> {
    let mut results = Vec::with_capacity(writes.len());
    if !ctx.isolated {
        // Change rows several to a statement: a failing write fails the whole job here, and
        // the replay (isolated, below) writes each row at once, so none is held back past a
        // savepoint it would have to be rolled back with.
        return write::defer_changes(ctx, |ctx| {
            for prepared in writes {
                let result = apply_one(ctx, prepared, writer, now);
                if let Err(err) = &result {
                    if !fails_cleanly(err) {
                        return Err(StoreError::Backend(format!(
                            "a write of the batch failed half-way ({err}); the group is \
                             replayed with each write isolated"
                        )));
                    }
                }
                results.push(result);
            }
            Ok(results)
        });
    }
    for prepared in writes {
        exec(ctx, "SAVEPOINT batch_write")?;
        let result = apply_one(ctx, prepared, writer, now);
        if result.is_err() {
            exec(ctx, "ROLLBACK TO batch_write")?;
            ctx.keys.clear();
        }
        exec(ctx, "RELEASE batch_write")?;
        results.push(result);
    }
    Ok(results)
}
