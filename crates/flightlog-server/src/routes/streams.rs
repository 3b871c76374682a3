//! Live Server-Sent-Event streams: the global change stream, a run's stream, an engagement's.
//!
//! The database is the only source: a stream waits on the store's change doorbell (rung after
//! every commit, ours or another process's) and then reads a page of the changes after its
//! cursor (`changes_since_bounded`). So a stream can only ever send what is committed (persist,
//! then emit), it never skips or repeats a change id, a reconnect with `Last-Event-ID` resumes
//! exactly, and a slow client costs nothing but its own reads and one page (bounded in count
//! and bytes): the response body pulls the next page only when the socket has taken the
//! previous one, so no per-client buffer grows and no writer ever waits for a reader. Clients
//! of the change stream that have caught up share one reading of each commit (the server's
//! [`ChangeTail`]); a client that falls behind it reads for itself again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use flightlog_core::activity::{ActivityChange, ActivityStore, ChangeDoorbell};
use flightlog_core::journal::{EngagementEvent, EngagementJournal, JournalTail, TailBound};
use futures_util::stream::{self, Stream};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::change_tail::{ChangeTail, FillError};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{check_query_escapes, first_given_parameter, ApiQuery, PathId};
use crate::journal_hub::{Delivery, EngagementSubscription, JournalHub};
use crate::metrics::{StreamEnds, StreamKind};
use crate::openapi::{tags, ENGAGEMENT_ID, RUN_ID};
use crate::response_budget::ChunkedJson;
use crate::run_hub::{RunHub, RunSubscription};
use crate::sse::SseEvent;
use crate::state::{AppState, StreamPlace};

/// Changes read from the database per query while a stream catches up.
pub(crate) const PAGE: i64 = 500;
/// And at most about this many bytes of attrs and payloads in a page: a stream holds its page
/// until its client has taken it (up to the write-stall limit, 30 s, for a client that reads
/// nothing), and 500 changes of a span with a megabyte of attrs were half a gigabyte per such
/// client (an audit's finding: five of them took the server to 1.6 GB).
pub(crate) const PAGE_BYTES: usize = 4 * 1024 * 1024;
/// A journal stream's page: as few events as the change stream's, and at most about 1 MiB of
/// their data's JSON text (parsed, the page holds a few times that). Read all at once, one
/// 18 MB engagement was 116–148 MiB per slow client (an audit's finding: 16 such clients took
/// the server to 2.6 GB), and the read held a runtime worker for a third of a second.
const JOURNAL_PAGE: TailBound = TailBound {
    max_events: PAGE as usize,
    max_bytes: 1024 * 1024,
};
/// A stream re-reads even without a doorbell this often (a safety net, not the mechanism).
const RECHECK: Duration = Duration::from_secs(5);
/// The keep-alive: a comment line after this long without an event. The contract asks for one
/// at least every 15 s; at exactly 15 s a late timer (a loaded machine) broke that, and a client
/// or proxy with a 15 s idle timeout raced it.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// A stream's 503, as the OpenAPI document describes it.
const STORE_LOST: &str = "As many live streams are open as the server serves at once (three \
     quarters of `--max-connections` rounded down, none at 1, so writes always find a \
     connection; carries \
     `Retry-After`); or the store cannot serve a live stream: its database file was deleted or \
     replaced while the server ran (the message says which; `/healthz` says the same). An open \
     stream ends with an `error` event within a few seconds of it.";
/// The run stream's 503, as the OpenAPI document describes it.
const RUN_STREAM_BUSY_OR_STORE_LOST: &str = "The snapshot is large and the server's memory for \
     large answers is taken by other clients' for now, or as many live streams are open as the \
     server serves at once (three quarters of `--max-connections` rounded down, none at 1); \
     both carry `Retry-After`. \
     Or the store cannot serve a live stream: its database file was deleted or replaced while \
     the server ran (the message says which; `/healthz` says the same).";

/// The journal stream's `Last-Event-ID`, as the OpenAPI document describes it.
const JOURNAL_LAST_EVENT_ID: &str = "The `id:` of the last event received (sent by a \
     reconnecting EventSource), `<seq>@<generation>`: the stream resumes right after it, or \
     sends `resync` first when the engagement was renumbered since. A bare seq is accepted \
     (resumed without that check). An event the engagement does not hold (in the generation \
     named) is a 400. Takes precedence over the query.";

/// The `Last-Event-ID` header of a reconnecting client, as the OpenAPI document describes it.
const LAST_EVENT_ID: &str = "The `id:` of the last event received (sent by a reconnecting \
     EventSource), a change id: the stream resumes right after it. Takes precedence over the \
     query. Blank: as if absent.";

/// The run stream's `Last-Event-ID`, as the OpenAPI document describes it.
const RUN_LAST_EVENT_ID: &str = "The `id:` of the last event received (sent by a reconnecting \
     EventSource), a change id: the stream skips the snapshot and resumes right after it. Blank: \
     as if absent.";

/// A schema and the name it has in `components.schemas`.
type NamedSchema = (
    String,
    utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
);

/// One kind of event a stream sends, as the OpenAPI document lists it (`x-sse-events`).
pub(crate) struct StreamEventDoc {
    /// The `event:` field.
    pub(crate) name: &'static str,
    /// The schema (in `components.schemas`) of its `data:`, one JSON value.
    pub(crate) data: fn() -> NamedSchema,
    /// What its `id:` holds, or that it has none.
    pub(crate) id: &'static str,
    /// When it is sent.
    pub(crate) description: &'static str,
}

/// `T`'s name and schema, for [`StreamEventDoc::data`].
fn schema_of<T: ToSchema>() -> NamedSchema {
    (T::name().into_owned(), T::schema())
}

/// Every schema the stream events refer to, nested ones included, for `components.schemas`.
pub(crate) fn stream_event_schemas(schemas: &mut Vec<NamedSchema>) {
    schemas.push(schema_of::<ActivityChange>());
    <ActivityChange as ToSchema>::schemas(schemas);
    schemas.push(schema_of::<flightlog_core::activity::RunSnapshot>());
    <flightlog_core::activity::RunSnapshot as ToSchema>::schemas(schemas);
    schemas.push(schema_of::<EngagementEvent>());
    <EngagementEvent as ToSchema>::schemas(schemas);
    schemas.push(schema_of::<ErrorBody>());
    <ErrorBody as ToSchema>::schemas(schemas);
    schemas.push(schema_of::<ChangeStreamResync>());
    schemas.push(schema_of::<JournalStreamResync>());
}

const CHANGE_EVENT: StreamEventDoc = StreamEventDoc {
    name: "change",
    data: schema_of::<ActivityChange>,
    id: "the change's `changeId`",
    description: "one committed change, in `changeId` order",
};
const RESYNC_EVENT: StreamEventDoc = StreamEventDoc {
    name: "resync",
    data: schema_of::<ChangeStreamResync>,
    id: "none",
    description: "the last event: the change log no longer holds every change after the \
                  stream's cursor (or the run was pruned and started again); take a new \
                  snapshot and reconnect",
};
const ERROR_EVENT: StreamEventDoc = StreamEventDoc {
    name: "error",
    data: schema_of::<ErrorBody>,
    id: "none",
    description: "the last event: the store failed (code `unavailable`); reconnect with \
                  `Last-Event-ID`",
};

/// What each stream route sends, by path, for the OpenAPI document.
pub(crate) const STREAM_EVENTS: [(&str, &[StreamEventDoc]); 3] = [
    (
        "/v1/activity/changes/stream",
        &[CHANGE_EVENT, RESYNC_EVENT, ERROR_EVENT],
    ),
    (
        "/v1/activity/runs/{runId}/stream",
        &[
            StreamEventDoc {
                name: "snapshot",
                data: schema_of::<flightlog_core::activity::RunSnapshot>,
                id: "the change id the stream follows from: a reconnect with it resumes right \
                     after the snapshot",
                description: "the first event (not sent on a reconnect with `Last-Event-ID`): \
                              the run as it stands; the `change` events that follow have a \
                              `seq` above its `highWaterSeq`",
            },
            CHANGE_EVENT,
            RESYNC_EVENT,
            ERROR_EVENT,
        ],
    ),
    (
        "/v1/engagements/{engagementId}/stream",
        &[
            StreamEventDoc {
                name: "journal",
                data: schema_of::<EngagementEvent>,
                id: "`<seq>@<generation>`",
                description: "one event of the engagement, in seq order",
            },
            StreamEventDoc {
                name: "resync",
                data: schema_of::<JournalStreamResync>,
                id: "`-1@<generation>` (the new generation), or none",
                description: "the engagement's seqs were given out again (compacted, or \
                              pruned and started anew): drop the events held; the stream \
                              goes on from seq 0",
            },
            ERROR_EVENT,
        ],
    ),
];

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(change_stream))
        .routes(routes!(run_stream))
        .routes(routes!(journal_stream))
        .route_layer(axum::middleware::map_response(close_after_refusal))
}

/// A stream refused `503` (every place taken, the store lost, no room for its snapshot) is
/// answered with `Connection: close`: its client retries after `Retry-After`, and on a
/// keep-alive connection each retry kept that connection in use, so clients refused past the
/// streams' three quarters of `--max-connections` held the quarter kept for writes (an audit:
/// two such clients at a limit of 8, retrying every second, left a write unanswered for 30 s).
/// Closed, the connection is free between the retries.
async fn close_after_refusal(mut response: Response) -> Response {
    if response.status() == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// Query of `GET /v1/activity/changes/stream`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct AfterQuery {
    /// Send every change with `changeId` above this; without it (and without `Last-Event-ID`)
    /// the stream starts at the newest change.
    #[param(minimum = 0)]
    after: Option<i64>,
}

/// Query of `GET /v1/engagements/{engagementId}/stream`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct FromSeqQuery {
    /// The first seq to send (default 0); at most the engagement's next seq (a start past its
    /// end is a 400: the events up to it would never be sent).
    #[param(minimum = 0)]
    from_seq: Option<i64>,
    /// The numbering the client's events came from (the part after `@` of their ids): with
    /// `fromSeq`, a stream that finds the engagement renumbered since (compacted, or pruned
    /// and created again) sends a `resync` first and starts from seq 0, as a `Last-Event-ID`
    /// of `<seq>@<generation>` does. Without it a resume by `fromSeq` is taken as it is, and
    /// cannot tell a renumbered engagement from the one the client followed.
    #[param(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    generation: Option<u64>,
}

/// `Last-Event-ID` (a reconnecting EventSource) wins over the query's starting point.
fn last_event_id(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    let Some(value) = last_event_id_header(headers)? else {
        return Ok(None);
    };
    match value
        .to_str()
        .ok()
        .map(|text| parse_event_number(text.trim()))
    {
        Some(Ok(id)) => Ok(Some(id)),
        Some(Err(EventNumberError::TooLarge)) => Err(ApiError::invalid(
            "Last-Event-ID is larger than any change id (at most 18 digits): send the id of the \
             last event received",
        )),
        _ => Err(ApiError::invalid(
            "Last-Event-ID must be a change id this stream sent: a non-negative integer",
        )),
    }
}

/// Why the text of an event id is not one.
enum EventNumberError {
    /// Not a plain decimal number (a sign, a fraction, letters, nothing).
    NotANumber,
    /// More than an `i64` holds.
    TooLarge,
}

/// A non-negative decimal number as event ids are written: digits only (no sign, as the
/// OpenAPI pattern says).
fn parse_event_number(text: &str) -> Result<i64, EventNumberError> {
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(EventNumberError::NotANumber);
    }
    text.parse::<i64>().map_err(|_| EventNumberError::TooLarge)
}

/// The `Last-Event-ID` header, unless absent or blank: an empty one (a proxy's, or a client's
/// with nothing seen yet) is no header, as a blank query parameter is no parameter. Two of
/// them are refused, as a repeated query parameter is: honouring either would make the
/// starting point depend on their order.
fn last_event_id_header(headers: &HeaderMap) -> Result<Option<&axum::http::HeaderValue>, ApiError> {
    let mut values = headers
        .get_all("last-event-id")
        .iter()
        .filter(|value| !value.as_bytes().trim_ascii().is_empty());
    let first = values.next();
    if values.next().is_some() {
        return Err(ApiError::invalid(
            "Last-Event-ID is given more than once: send the id of the last event received, once",
        ));
    }
    Ok(first)
}

/// Only the changes of one run above its snapshot's high-water seq.
#[derive(Debug, Clone)]
struct RunFilter {
    run_id: String,
    /// The highest seq of the run the client holds; `None` for a stream resumed with
    /// `Last-Event-ID`, which carries a change id, not a seq (see `take_page`).
    above_seq: Option<i64>,
}

/// A cursor over the change log that waits on the doorbell when it has caught up.
struct ChangeFeed {
    store: Arc<dyn ActivityStore>,
    doorbell: ChangeDoorbell,
    cursor: i64,
    pending: VecDeque<ActivityChange>,
    filter: Option<RunFilter>,
    /// Set when a page showed the followed run pruned and started again under the same id: the
    /// stream sends what it holds, then a `resync`.
    run_recreated: bool,
    /// With `run_recreated`, for a stream resumed with `Last-Event-ID` that had seen no change
    /// of its run: the run's seq 1 came after the id, so the run began (or began again) after
    /// it, which the `resync` says as such (it named a prune first, to a client that had opened
    /// the stream before the run's first span: an audit's finding).
    run_began_after_id: bool,
    /// Set when a page showed a change of the followed run past the next seq: the ones between
    /// were deleted (trimmed) after the cursor passed below them; a `resync` follows what it
    /// holds.
    run_lost_changes: bool,
    failed: bool,
    /// When the store's file was last checked (see `check_health`).
    health_checked: Instant,
    /// A run stream's wake-ups (see [`crate::run_hub`]): it looks at the store when its run may
    /// have moved, not after every commit. `None` for the change stream, which waits on the
    /// doorbell.
    run_wake: Option<RunSubscription>,
    /// Pages of the change log read so far (what following one quiet run must not cost).
    #[cfg_attr(not(test), allow(dead_code))]
    pages_read: u64,
    /// Looks at the store so far (steps), of which a run stream takes none for other runs'
    /// commits.
    #[cfg_attr(not(test), allow(dead_code))]
    looks: u64,
}

impl ChangeFeed {
    fn new(store: Arc<dyn ActivityStore>, cursor: i64, filter: Option<RunFilter>) -> Self {
        Self {
            doorbell: store.change_doorbell(),
            store,
            cursor,
            pending: VecDeque::new(),
            filter,
            run_recreated: false,
            run_began_after_id: false,
            run_lost_changes: false,
            failed: false,
            health_checked: Instant::now(),
            run_wake: None,
            looks: 0,
            pages_read: 0,
        }
    }

    /// A run stream's feed: it looks at the store when `hub` says its run may have moved.
    fn for_run(
        store: Arc<dyn ActivityStore>,
        cursor: i64,
        filter: RunFilter,
        hub: &RunHub,
    ) -> Self {
        let wake = hub.subscribe(&store, &filter.run_id);
        Self {
            run_wake: Some(wake),
            ..Self::new(store, cursor, Some(filter))
        }
    }

    /// Queue a page's changes this feed sends. A run's seqs only grow, so a change of the
    /// followed run at or below the highest seq already passed means the run was pruned and its
    /// id used again (seqs start over at 1): following on would mix two runs, or silently skip
    /// the new one's first changes.
    ///
    /// A stream resumed with `Last-Event-ID` does not know the seq its client holds, only that
    /// the client was sent a snapshot of the run at or before that change id: the run's seq 1
    /// was then at or below it. So a seq 1 after it means the seqs started over (the run was
    /// pruned and started again), which a client holding the old `highWaterSeq` would silently
    /// discard.
    fn take_page(&mut self, page: Vec<ActivityChange>) {
        for change in page {
            let Some(filter) = &mut self.filter else {
                self.pending.push_back(change);
                continue;
            };
            if change.run_id != filter.run_id {
                continue;
            }
            if change.seq <= filter.above_seq.unwrap_or(1) {
                self.run_recreated = true;
                self.run_began_after_id = filter.above_seq.is_none();
                return;
            }
            // A run's seqs are dense: one past the next means the ones between are gone.
            if filter.above_seq.is_some_and(|above| change.seq > above + 1) {
                self.run_lost_changes = true;
                return;
            }
            filter.above_seq = Some(change.seq);
            self.pending.push_back(change);
        }
    }

    /// Whether a run stream may go on although changes after its cursor were deleted: they
    /// were other runs' (pruned), and the followed run's own changes are all still there or
    /// will show as a gap in its seqs. The change stream follows every run, so for it any
    /// deleted change is a gap.
    ///
    /// The run's own rows go two ways. Pruned with the run: it then has no seq (high-water
    /// seq 0), or, started again under its id, starts its seqs over (`run_recreated`).
    /// Trimmed: the store keeps the highest seq it trimmed of the run, and the run's next
    /// change goes on from it; the client missed nothing of the run if that is at or below
    /// what it holds. A
    /// stream that does not know its client's seq yet (resumed with `Last-Event-ID`, no change
    /// of the run seen since) cannot tell, and resyncs as the change stream does. Before this,
    /// every run stream opened or resumed across a prune of *other* runs ended with a
    /// `resync`, and its client fetched a snapshot again for nothing (an audit's finding).
    async fn own_run_intact(&self) -> Result<bool, FeedEnd> {
        let Some(RunFilter {
            run_id,
            above_seq: Some(above),
        }) = &self.filter
        else {
            return Ok(false);
        };
        if *above < 1 {
            return Ok(false);
        }
        let high = self
            .store
            .run_high_water_seq(run_id)
            .await
            .map_err(|err| FeedEnd::Failed(err.to_string()))?;
        if high == 0 {
            return Ok(false);
        }
        let trimmed = self
            .store
            .run_trimmed_seq(run_id)
            .await
            .map_err(|err| FeedEnd::Failed(err.to_string()))?;
        Ok(trimmed <= *above)
    }

    /// Whether a run stream has nothing to read: its run logged no change after the cursor, and
    /// nothing after the cursor was deleted (so none of the run's changes went unseen). Two
    /// cheap reads instead of a page of every run's changes, which 200 run streams on quiet
    /// runs read (and decoded) after every commit: a core's worth of CPU at 2,000 writes/s,
    /// and the followed runs' own changes arrived 50–180 ms late (an audit's finding). The
    /// horizon is read after the run's newest change, as after a page (see `next_change`).
    async fn followed_run_held_still(&self) -> Result<bool, FeedEnd> {
        let Some(filter) = &self.filter else {
            return Ok(false);
        };
        let newest = self
            .store
            .run_newest_change_id(&filter.run_id)
            .await
            .map_err(|err| FeedEnd::Failed(err.to_string()))?;
        if newest.is_some_and(|newest| newest > self.cursor) {
            return Ok(false);
        }
        if newest.is_none() && filter.above_seq.is_none_or(|above| above > 0) {
            // No change of the run is logged: trimmed (it keeps its seq), or its detail was
            // pruned (it has none), which no change says: a caught-up client of a run pruned
            // before it ended (an OpenTelemetry trace whose root never came, by the hard
            // ceiling) went on showing it live (an audit's finding).
            let high = self
                .store
                .run_high_water_seq(&filter.run_id)
                .await
                .map_err(|err| FeedEnd::Failed(err.to_string()))?;
            // A stream resumed with `Last-Event-ID` (no seq seen yet) may have been opened
            // before its run's first span, to wait for it (the run's first change then ends it
            // with a `resync`, see `take_page`); only a run whose rollup says its detail was
            // pruned is over for it. Such a client, away while the prune ran, waited on in
            // silence (an audit's finding).
            let pruned = high == 0
                && (filter.above_seq.is_some()
                    || self
                        .store
                        .read_rollup(&filter.run_id)
                        .await
                        .map_err(|err| FeedEnd::Failed(err.to_string()))?
                        .is_some_and(|rollup| rollup.detail_pruned));
            if pruned {
                return Err(FeedEnd::Resync {
                    horizon: self.horizon().await?,
                    reason: RUN_PRUNED,
                });
            }
        }
        let horizon = self
            .store
            .change_log_horizon()
            .await
            .map_err(|err| FeedEnd::Failed(err.to_string()))?;
        Ok(self.cursor.saturating_add(1) >= horizon)
    }

    /// The change log's horizon now, for a `resync` (its `changeLogHorizon` and `resumeAfter`
    /// said the stream's cursor before, which is not where the log begins).
    async fn horizon(&self) -> Result<i64, FeedEnd> {
        self.store
            .change_log_horizon()
            .await
            .map_err(|err| FeedEnd::Failed(err.to_string()))
    }

    /// The next committed change after the cursor, waiting for one if need be; `Err` when the
    /// store failed, the cursor fell behind what the log still holds, or the followed run was
    /// started again (the stream then ends with an `error` or `resync` event).
    async fn next_change(&mut self) -> Result<ActivityChange, FeedEnd> {
        loop {
            if let Some(change) = self.pending.pop_front() {
                return Ok(change);
            }
            if self.step().await? == Step::CaughtUp {
                match self.run_wake.as_mut() {
                    Some(wake) => {
                        let _ = tokio::time::timeout(RECHECK, wake.woken()).await;
                    }
                    None => {
                        let _ = tokio::time::timeout(RECHECK, self.doorbell.changed()).await;
                    }
                }
            }
        }
    }

    /// One read of the change log after the cursor, without waiting: the changes it found are
    /// queued (`pending`) and the cursor moved past them, or the feed is caught up (nothing
    /// after the cursor is readable up to the doorbell's last ring). `Err` as `next_change`.
    async fn step(&mut self) -> Result<Step, FeedEnd> {
        if self.run_recreated {
            return Err(FeedEnd::Resync {
                horizon: self.horizon().await?,
                reason: if self.run_began_after_id {
                    RUN_BEGAN_AFTER_ID
                } else {
                    RUN_RECREATED
                },
            });
        }
        if self.run_lost_changes {
            return Err(FeedEnd::Resync {
                horizon: self.horizon().await?,
                reason: LOG_TRIMMED,
            });
        }
        if let Some(failed) = check_health(&mut self.health_checked, || self.store.health()) {
            return Err(FeedEnd::Failed(failed));
        }
        self.looks += 1;
        if let Some(wake) = &self.run_wake {
            // Past the ids the run hub looked through without a change of this run: a quiet
            // run's stream reads from where its run may have moved, not from its last look.
            self.cursor = wake.skip_clean(self.cursor);
        }
        // Note the doorbell before reading, so a commit landing during the read rings again.
        let rung = *self.doorbell.borrow_and_update();
        if self.followed_run_held_still().await? {
            // Nothing of the run up to `rung`: the other runs' changes are not read at all.
            self.cursor = self.cursor.max(rung);
            return Ok(Step::CaughtUp);
        }
        let page = self
            .store
            .changes_since_bounded(self.cursor, PAGE, PAGE_BYTES)
            .await
            .map_err(|err| FeedEnd::Failed(err.to_string()))?;
        self.pages_read += 1;
        // The horizon after the page: it only grows, in the transaction that deletes, so a
        // prune or trim that committed before the page was read is seen here, and one
        // after it deleted nothing the page holds.
        let horizon = self
            .store
            .change_log_horizon()
            .await
            .map_err(|err| FeedEnd::Failed(err.to_string()))?;
        if self.cursor.saturating_add(1) < horizon && !self.own_run_intact().await? {
            // Changes after the cursor may have been trimmed or pruned: streaming on would be
            // a silent gap, so the client is told to start again from a snapshot.
            return Err(FeedEnd::Resync {
                horizon,
                reason: LOG_TRIMMED,
            });
        }
        if let Some(last) = page.last() {
            self.cursor = last.change_id;
            self.take_page(page);
            return Ok(Step::Read);
        }
        if rung > self.cursor {
            // Everything up to `rung` is committed and none of it is readable any more
            // (pruned): nothing to send for it.
            self.cursor = rung;
            return Ok(Step::Read);
        }
        Ok(Step::CaughtUp)
    }
}

/// What one [`ChangeFeed::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// It moved the cursor (and queued what it read, if anything): read again.
    Read,
    /// Nothing after the cursor is readable: wait for the doorbell.
    CaughtUp,
}

/// A client of the global change stream: it takes its changes from the server's shared tail
/// (read and encoded once for every client at the head of the log, see [`ChangeTail`]) while
/// its cursor is inside it, and reads the database itself ([`ChangeFeed`]) while it is not:
/// when it starts, or falls behind the tail's oldest frame, or the tail started again past a
/// gap (the database then tells it to resync).
///
/// A client's first reading is its own, even when the tail covers its cursor: the tail learns
/// of a prune only when it next reads, so a client that came back after one was sent the
/// pruned run's changes and no resync; and the tail's frames hold each span as it was when
/// the tail read it, while a client resuming expects its first changes as they are now, as the
/// change pages give them (an audit's findings). (Not until it has caught up: under
/// sustained writes a client may never find the log's end, and would read for itself for
/// good, the cost the tail is there to save.)
struct GlobalFeed {
    own: ChangeFeed,
    tail: Arc<ChangeTail>,
    /// Whether it read the log itself once, and so may take from the tail.
    joined: bool,
    failed: bool,
}

impl GlobalFeed {
    fn new(store: Arc<dyn ActivityStore>, tail: Arc<ChangeTail>, cursor: i64) -> Self {
        Self {
            own: ChangeFeed::new(store, cursor, None),
            tail,
            joined: false,
            failed: false,
        }
    }

    /// The next changes after the cursor, encoded (one or more), waiting for some if need be;
    /// `Err` as [`ChangeFeed::next_change`].
    async fn next_events(&mut self) -> Result<SseEvent, FeedEnd> {
        loop {
            if let Some(change) = self.own.pending.pop_front() {
                return Ok(change_event(&change));
            }
            if let Some(taken) = self
                .joined
                .then(|| self.tail.take(self.own.cursor))
                .flatten()
            {
                self.own.cursor = taken.cursor;
                if !taken.frames.is_empty() {
                    return Ok(SseEvent::encoded(taken.frames));
                }
                // Up to date with the tail: read on for everyone when the doorbell rang past it.
                if let Some(failed) =
                    check_health(&mut self.own.health_checked, || self.own.store.health())
                {
                    return Err(FeedEnd::Failed(failed));
                }
                let rung = *self.own.doorbell.borrow_and_update();
                if rung <= self.own.cursor {
                    // The doorbell's value only grows; it rings without moving after a prune.
                    // Either (or the safety net's timeout) is a reason to read.
                    let _ = tokio::time::timeout(RECHECK, self.own.doorbell.changed()).await;
                }
                let rung = *self.own.doorbell.borrow_and_update();
                self.fill(rung).await?;
                continue;
            }
            let step = self.own.step().await?;
            // One reading of its own done (its horizon checked, its first page fresh): from now
            // on it takes from the tail whenever its cursor is inside.
            self.joined = true;
            match step {
                Step::Read => continue,
                Step::CaughtUp => {
                    // Caught up on its own: from now on it follows the tail.
                    let rung = *self.own.doorbell.borrow();
                    self.tail
                        .join(self.own.store.as_ref(), self.own.cursor, rung)
                        .await
                        .map_err(|FillError::Store(err)| FeedEnd::Failed(err.to_string()))?;
                    if self.tail.take(self.own.cursor).is_none() {
                        // The tail could not take it (another client moved it meanwhile): wait
                        // as a stream reading for itself does, then try again.
                        let _ = tokio::time::timeout(RECHECK, self.own.doorbell.changed()).await;
                    }
                }
            }
        }
    }

    async fn fill(&self, rung: i64) -> Result<(), FeedEnd> {
        self.tail
            .fill(self.own.store.as_ref(), self.own.cursor, rung)
            .await
            .map_err(|FillError::Store(err)| FeedEnd::Failed(err.to_string()))
    }
}

/// A global feed's events; its end (a resync or an error) is counted in `ends`.
fn global_feed_stream(feed: GlobalFeed, ends: StreamEnds) -> impl Stream<Item = SseEvent> {
    stream::unfold((feed, ends), |(mut feed, ends)| async move {
        if feed.failed {
            return None;
        }
        let event = match feed.next_events().await {
            Ok(event) => event,
            Err(FeedEnd::Failed(message)) => {
                feed.failed = true;
                ends.error.inc();
                error_event(&message)
            }
            Err(FeedEnd::Resync { horizon, reason }) => {
                feed.failed = true;
                ends.resync.inc();
                ends.resync_sent.inc();
                resync_event(horizon, reason, false)
            }
        };
        Some((event, (feed, ends)))
    })
}

/// Every `RECHECK` (a stream wakes at least that often), whether the store still has its file:
/// `Some(why)` when it lost it. Reads go on from the open file of a database deleted or
/// replaced under the server, so a stream kept sending keep-alives while every write and
/// `/healthz` said 503, and a live dashboard looked healthy on a dead server (an audit's
/// finding). One `stat` a stream every few seconds, not one per commit.
fn check_health<E: std::fmt::Display>(
    checked: &mut Instant,
    health: impl FnOnce() -> Result<(), E>,
) -> Option<String> {
    if checked.elapsed() < RECHECK {
        return None;
    }
    *checked = Instant::now();
    health().err().map(|err| err.to_string())
}

/// Where a client that is up to date now (it asked for no starting point) starts following: the
/// newest change id, or just below the change-log horizon when a prune deleted the newest
/// changes. The reference's cursor is the highest id *still in the log*, which goes down when a
/// prune deletes the newest rows, while the horizon (which counts them) does not: starting at
/// the cursor would be "behind the horizon", and such a client was told to resync on every
/// attempt until something new was written. The two are read one after the other, so a change
/// committed between the reads may fall below the start: for a client that asked for "from now
/// on" that is connecting a moment later. A run stream's client, which must continue its
/// snapshot exactly, starts at `follow_from_snapshot` instead.
async fn newest_position(store: &dyn ActivityStore) -> Result<i64, ApiError> {
    let cursor = store.latest_change_cursor().await?;
    let horizon = store.change_log_horizon().await?;
    Ok(cursor.max(horizon.saturating_sub(1)))
}

/// Refuse a starting point beyond every change id this database has given out: a client holding
/// an id of another database (or of this one before it was restored from a backup) would
/// otherwise wait in silence while the ids up to its cursor were given out, and never see them.
async fn check_not_beyond_newest(store: &dyn ActivityStore, start: i64) -> Result<(), ApiError> {
    let newest = newest_position(store).await?;
    if start > newest {
        return Err(ApiError::invalid(format!(
            "the stream cannot start after change {start}: the newest change id of this \
             database is {newest}, so the id comes from another database (or from this one \
             before it was restored from a backup); take a new snapshot and connect without \
             after or Last-Event-ID"
        )));
    }
    Ok(())
}

/// Where a run stream follows from after a snapshot read at `cursor`, with the change-log
/// horizon read just before and just after the snapshot.
///
/// The horizon may be above the cursor (a prune deleted the newest changes), and following from
/// the cursor would then be "behind the horizon" (a resync on every attempt). When the horizon
/// did not move during the read, every id between the cursor and it was deleted before the
/// snapshot and every later change gets a higher id, so the stream starts at the higher of the
/// two. When it moved, a prune or trim committed during the read, and the ids below the new
/// horizon may include changes of this run committed after the snapshot: starting above them
/// (as this did with one horizon read after the snapshot) skipped them without a word. The
/// stream then starts at the cursor, and the feed ends it with a `resync` if anything of the run
/// after the cursor is gone (see `ChangeFeed::own_run_intact`).
fn follow_from_snapshot(cursor: i64, horizon_before: i64, horizon_after: i64) -> i64 {
    if horizon_before == horizon_after {
        cursor.max(horizon_after.saturating_sub(1))
    } else {
        cursor
    }
}

/// Why a change feed stopped.
#[derive(Debug)]
enum FeedEnd {
    /// The store failed; the client may reconnect with its last event id.
    Failed(String),
    /// The cursor is below what the change log still holds, or the followed run was started
    /// again under its id.
    Resync { horizon: i64, reason: &'static str },
}

/// A `resync`'s reason when the log no longer holds every change after the cursor.
const LOG_TRIMMED: &str = "the change log no longer holds every change after this stream's \
                           cursor (trimmed, or deleted with a pruned run)";
/// A `resync`'s reason when the followed run's seqs start again after the stream's cursor: the
/// run was pruned and its id used again, or the `Last-Event-ID` given is older than the run.
const RUN_RECREATED: &str = "the run's changes start again at seq 1 after this stream's cursor \
                             (the run was pruned and a new run started under its id, or the \
                             Last-Event-ID is older than the run)";

/// A `resync`'s reason when the followed run's detail was pruned: no change says so.
const RUN_PRUNED: &str = "the run's detail was pruned (its spans and events deleted; its rollup, \
     GET /v1/activity/runs/{runId}/rollup, says how it ended, and its snapshot is gone)";

/// A `resync`'s reason when a run stream resumed with `Last-Event-ID` meets its run's seq 1
/// after that id: the client's events cannot be of this run's current life.
const RUN_BEGAN_AFTER_ID: &str = "the run's first change comes after the Last-Event-ID given: the \
     run began (or began again, after a prune) since that id, so what the client holds is not \
     of it; a run stream starts with the run's snapshot, which needs the run's first span";

/// The `data:` of a change or run stream's `resync` event, its last: the stream cannot go on
/// without a gap.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ChangeStreamResync {
    /// Why the stream ended.
    reason: &'static str,
    /// The oldest change id the change log still holds after the stream's cursor.
    change_log_horizon: i64,
    /// Where to resume the change stream: reconnect with `after` = the larger of this and a new
    /// snapshot's cursor. (A run stream starts over: reconnect without `Last-Event-ID`, and its
    /// first event is a new snapshot.)
    resume_after: i64,
    /// What the client does next, in words.
    action: &'static str,
}

/// A `resync`'s action on the change stream.
const CHANGE_STREAM_ACTION: &str = "take a new snapshot, then reconnect with after = the larger \
     of its cursor and resumeAfter (or with no after, to start at the newest change)";
/// A `resync`'s action on a run stream whose run's detail was pruned: a new stream of it is a
/// `404` until its id is written again, so "reconnect" (the action of every other run-stream
/// resync) could not work (an audit's finding).
const RUN_PRUNED_ACTION: &str = "drop what you hold of the run: its detail is gone, and a new \
     stream of it answers 404 until its run id is written again; read how it ended at \
     GET /v1/activity/runs/{runId}/rollup";
/// A `resync`'s action on a run stream (which has no `after`).
const RUN_STREAM_ACTION: &str = "drop what you hold of the run and reconnect without \
     Last-Event-ID: the stream starts again with a new snapshot";

fn resync_event(horizon: i64, reason: &'static str, run_stream: bool) -> SseEvent {
    let body = ChangeStreamResync {
        reason,
        change_log_horizon: horizon,
        resume_after: horizon.saturating_sub(1).max(0),
        action: if run_stream && reason == RUN_PRUNED {
            RUN_PRUNED_ACTION
        } else if run_stream {
            RUN_STREAM_ACTION
        } else {
            CHANGE_STREAM_ACTION
        },
    };
    SseEvent::json("resync", None, &body)
}

fn change_event(change: &ActivityChange) -> SseEvent {
    SseEvent::json("change", Some(&change.change_id.to_string()), change)
}

/// A stream's `error` event, its last: the store failed; the `data:` is an [`ErrorBody`] with
/// the code `unavailable`, and the client reconnects with its `Last-Event-ID`.
fn error_event(message: &str) -> SseEvent {
    let body = ApiError::Unavailable(message.to_owned()).error_body();
    SseEvent::json("error", None, &body)
}

/// The feed's changes as events; the stream's end (a resync or an error) is counted in `ends`.
fn feed_stream(feed: ChangeFeed, ends: StreamEnds) -> impl Stream<Item = SseEvent> {
    stream::unfold((feed, ends), |(mut feed, ends)| async move {
        if feed.failed {
            return None;
        }
        let event = match feed.next_change().await {
            Ok(change) => change_event(&change),
            Err(FeedEnd::Failed(message)) => {
                feed.failed = true;
                ends.error.inc();
                error_event(&message)
            }
            Err(FeedEnd::Resync { horizon, reason }) => {
                feed.failed = true;
                ends.resync.inc();
                ends.resync_sent.inc();
                resync_event(horizon, reason, feed.filter.is_some())
            }
        };
        Some((event, (feed, ends)))
    })
}

/// The SSE response: keep-alive comments, the end of the stream when the server shuts down, and
/// the live-clients gauge of `kind` for as long as the response body exists.
fn sse<S>(state: &AppState, kind: StreamKind, place: StreamPlace, stream: S) -> Response
where
    S: Stream<Item = SseEvent> + Send + 'static,
{
    let mut closing = state.closing();
    let closed = async move {
        let _ = closing.wait_for(|closing| *closing).await;
    };
    let client = state.metrics().stream_opened(kind);
    let sent = state.metrics().stream_events(kind);
    let stream = futures_util::StreamExt::map(stream, move |event| {
        // The closure owns the guard, so the gauge goes down when the body is dropped: the
        // client went away, the stream ended, or the server shut down.
        let _client = (&client, &place);
        sent.inc_by(event.events());
        event
    });
    let stream = futures_util::StreamExt::take_until(stream, Box::pin(closed));
    crate::sse::response(stream, KEEP_ALIVE)
}

/// Every committed change after a cursor, in `changeId` order, live (Server-Sent Events).
///
/// `event: change` with an `ActivityChange` as `data:` and its `changeId` as `id:`; a
/// `: keep-alive` comment every 10 s without an event; `event: resync` (and the end of the
/// stream) when the cursor is behind the part of the change log that `prune` trimmed; `event:
/// error` when the store fails. Without `after` or `Last-Event-ID` it starts at the newest change.
#[utoipa::path(
    get,
    path = "/v1/activity/changes/stream",
    tag = tags::STREAMS,
    operation_id = "changeStream",
    params(
        AfterQuery,
        ("Last-Event-ID" = Option<String>, Header, description = LAST_EVENT_ID, nullable = false, pattern = r"^\s*[0-9]{0,18}\s*$"),
    ),
    responses(
        (status = 200, description = "The event stream (`change`, `resync`, `error` events).", content_type = "text/event-stream", body = String),
        (status = 400, description = "A bad `after` or `Last-Event-ID`: not a change id, or above the newest change id this database has given out (an id of another database, or of this one before a restore from a backup).", body = ErrorBody),
        (status = 503, description = STORE_LOST, body = ErrorBody),
    ),
)]
async fn change_stream(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<AfterQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let store = state.activity().clone();
    store.health()?;
    // Both are checked, whichever wins: a bad `after` is a 400 with or without the header.
    if query.after.is_some_and(|after| after < 0) {
        return Err(ApiError::invalid("after must be a non-negative integer"));
    }
    let start = match last_event_id(&headers)?.or(query.after) {
        Some(start) => {
            check_not_beyond_newest(store.as_ref(), start).await?;
            start
        }
        None => newest_position(store.as_ref()).await?,
    };
    let place = state.open_stream()?;
    Ok(sse(
        &state,
        StreamKind::Changes,
        place,
        global_feed_stream(
            GlobalFeed::new(store, Arc::clone(state.change_tail()), start),
            state.metrics().stream_ends(StreamKind::Changes),
        ),
    ))
}

/// One run live (Server-Sent Events): its snapshot, then its changes, gap-free.
///
/// First `event: snapshot` with the `RunSnapshot`, then `event: change` with each
/// `ActivityChange` of the run whose `seq` is above the snapshot's `highWaterSeq` (`id:` is the
/// `changeId`). A reconnect with `Last-Event-ID` skips the snapshot and resumes after that id.
#[utoipa::path(
    get,
    path = "/v1/activity/runs/{runId}/stream",
    tag = tags::STREAMS,
    operation_id = "runStream",
    params(
        ("runId" = String, Path, description = RUN_ID),
        ("Last-Event-ID" = Option<String>, Header, description = RUN_LAST_EVENT_ID, nullable = false, pattern = r"^\s*[0-9]{0,18}\s*$"),
    ),
    responses(
        (status = 200, description = "The event stream (`snapshot`, `change`, `resync`, `error` events).", content_type = "text/event-stream", body = String),
        (status = 400, description = "A bad id or `Last-Event-ID`: not a change id, or above the newest change id this database has given out (an id of another database, or of this one before a restore from a backup).", body = ErrorBody),
        (status = 404, description = "The run has no spans (unknown, or its detail pruned), and no `Last-Event-ID` was given.", body = ErrorBody),
        (status = 503, description = RUN_STREAM_BUSY_OR_STORE_LOST, body = ErrorBody),
    ),
)]
async fn run_stream(
    State(state): State<AppState>,
    headers: HeaderMap,
    PathId(run_id): PathId,
    uri: Uri,
) -> Result<impl IntoResponse, ApiError> {
    // The change stream takes `after`; a client that gave it here too got a full snapshot, not
    // the changes after it, and no word (an audit's finding). A blank parameter counts as not
    // given, as on every route; a broken escape is refused as on every route.
    if let Some(query) = uri.query() {
        check_query_escapes(query)?;
    }
    if let Some(name) = first_given_parameter(&uri) {
        return Err(ApiError::invalid(format!(
            "unknown query parameter `{name}`: the run stream takes no query parameters: it \
             starts with the run's snapshot, and a reconnecting client resumes with the \
             Last-Event-ID header"
        )));
    }
    let store = state.activity().clone();
    store.health()?;
    let resume = last_event_id(&headers)?;
    // Before the snapshot is read: a stream refused for want of a place costs nothing.
    let place = state.open_stream()?;
    let (first, feed) = match resume {
        // Every event of a run stream has an id past its run's first change, so no client was
        // sent 0; read as "the snapshot held the run" it ended the stream with a `resync`
        // saying the run was pruned and started again.
        Some(0) => {
            return Err(ApiError::invalid(
                "Last-Event-ID 0 is no event of a run stream: connect without it to get the \
                 run's snapshot first",
            ))
        }
        Some(cursor) => {
            check_not_beyond_newest(store.as_ref(), cursor).await?;
            let filter = RunFilter {
                run_id,
                above_seq: None,
            };
            let feed = ChangeFeed::for_run(store, cursor, filter, state.run_hub());
            (None, feed)
        }
        None => {
            let budget = state.response_budget();
            // The horizon before and after the snapshot: see `follow_from_snapshot`.
            let horizon_before = store.change_log_horizon().await?;
            let Some((snapshot, reserved)) = budget.read_snapshot(store.as_ref(), &run_id).await?
            else {
                return Err(super::activity::run_without_spans(store.as_ref(), &run_id).await);
            };
            let horizon_after = store.change_log_horizon().await?;
            let filter = RunFilter {
                run_id,
                above_seq: Some(snapshot.high_water_seq),
            };
            let follow_from =
                follow_from_snapshot(snapshot.change_cursor, horizon_before, horizon_after);
            let json = ChunkedJson::drain(snapshot)?;
            // A large snapshot holds budget until the stream is polled for what follows it,
            // which hyper does once it has written most of it (see `response_budget`).
            let permit = budget.settle(reserved, json.len()).await?;
            // Its id is where the stream follows from, so a client that reconnects right after
            // it resumes there; the cursor itself may be below the horizon (a prune deleted the
            // newest changes), and resuming from it was a resync on every attempt.
            let event =
                SseEvent::chunked_json("snapshot", Some(&follow_from.to_string()), json, permit);
            (
                Some(event),
                ChangeFeed::for_run(store, follow_from, filter, state.run_hub()),
            )
        }
    };
    // The snapshot (holding its share of the budget until its chunks are written), then the
    // changes after it.
    let head = stream::iter(first);
    Ok(sse(
        &state,
        StreamKind::Run,
        place,
        futures_util::StreamExt::chain(
            head,
            feed_stream(feed, state.metrics().stream_ends(StreamKind::Run)),
        ),
    ))
}

/// Where a journal stream starts: `fromSeq`, or a reconnecting client's `Last-Event-ID`, which
/// is `<seq>@<generation>` as this stream sends it (a bare `<seq>` is taken too, unchecked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct JournalStart {
    next_seq: i64,
    /// The generation the client's events came from, to be checked before resuming.
    generation: Option<u64>,
    /// Taken from `Last-Event-ID` (not `fromSeq`): what a refusal tells the client to drop.
    from_last_event_id: bool,
}

/// Refuse to resume after an event the engagement does not hold in the numbering the client
/// names: a stream that started past the end would wait for that seq and skip, without a word,
/// every event appended up to it (the activity streams refuse a cursor past the newest change
/// the same way). A `Last-Event-ID` of another generation is not refused: the stream answers it
/// with a `resync`. One read of the tail from the client's last event on, returned for the
/// stream's first read (so the tail is not read twice).
async fn check_resumable(
    journal: &dyn EngagementJournal,
    engagement_id: &str,
    start: &JournalStart,
) -> Result<Option<JournalTail>, ApiError> {
    let Some(last_seen) = start.next_seq.checked_sub(1).filter(|seq| *seq >= 0) else {
        return Ok(None);
    };
    let tail = journal
        .read_tail(engagement_id, last_seen, JOURNAL_PAGE)
        .await?;
    let renumbered = start
        .generation
        .is_some_and(|held| tail.generation != Some(held));
    if renumbered
        || tail
            .events
            .first()
            .is_some_and(|event| event.seq == last_seen)
    {
        return Ok(Some(tail));
    }
    Err(ApiError::invalid(format!(
        "cannot start the stream of engagement {engagement_id:?} after seq {last_seen} (at seq \
         {}): it holds no event with seq {last_seen}{}; start at a seq it holds (fromSeq at \
         most its next seq, 0 for all){}",
        start.next_seq,
        match tail.generation {
            None => " (it has no events)".to_owned(),
            Some(_) => String::new(),
        },
        if start.from_last_event_id {
            ", or connect without Last-Event-ID"
        } else {
            ""
        }
    )))
}

/// The largest seq a journal stream may have sent (2^53 - 1).
const LARGEST_SEQ: i64 = (1 << 53) - 1;

/// Parse a journal stream's `Last-Event-ID`: `<seq>` (0 or more) or `<seq>@<generation>` (seq
/// -1 or more: `-1@G` is the id of a `resync`, "nothing of generation G seen yet").
fn journal_last_event_id(headers: &HeaderMap) -> Result<Option<JournalStart>, ApiError> {
    let Some(value) = last_event_id_header(headers)? else {
        return Ok(None);
    };
    let parsed = value.to_str().ok().map(str::trim).and_then(|text| {
        let (seq, generation) = match text.split_once('@') {
            Some((seq, generation)) => (seq, Some(parse_event_number(generation).ok()?)),
            None => (text, None),
        };
        // Bounded as the `generation` query parameter is: no generation reaches 2^53 either.
        if generation.is_some_and(|generation| generation > LARGEST_SEQ) {
            return None;
        }
        let generation = generation.map(|generation| generation as u64);
        // `-1@G` is the one id with a sign.
        let seq = match seq {
            "-1" => -1,
            seq => parse_event_number(seq).ok()?,
        };
        let lowest = if generation.is_some() { -1 } else { 0 };
        // No seq reaches 2^53 (the JSON bound every number of the API keeps): a larger one was
        // never sent, and its successor is always exact.
        (lowest..=LARGEST_SEQ).contains(&seq).then(|| JournalStart {
            next_seq: seq + 1,
            generation,
            from_last_event_id: true,
        })
    });
    parsed.map(Some).ok_or_else(|| {
        ApiError::invalid(
            "Last-Event-ID must be an id this stream sent: <seq>@<generation> (each from 0 \
             to 2^53 - 1, or -1@<generation>), or a seq from 0 to 2^53 - 1",
        )
    })
}

/// What a journal stream sends next.
enum JournalItem {
    Event {
        event: EngagementEvent,
        generation: u64,
    },
    /// The seqs the client followed were given out again (compaction), or the engagement was
    /// deleted (prune): drop what you hold; what follows starts again at seq 0.
    Resync { generation: Option<u64> },
}

/// An engagement's events from `fromSeq`, then live ones as they commit. Every read also
/// returns the engagement's generation; when it differs from the one the client's events came
/// from, the feed sends a `resync` and starts over from seq 0, so a compaction or a prune is
/// never a silent gap (or a silent repeat under new numbers).
struct JournalFeed {
    journal: Arc<dyn EngagementJournal>,
    engagement_id: String,
    next_seq: i64,
    /// The generation of what the client holds; `None` until the engagement is first seen.
    generation: Option<u64>,
    pending: VecDeque<JournalItem>,
    /// A read made before the feed started (the resume check's), taken as its first read.
    first_read: Option<JournalTail>,
    /// The engagement's events as they commit; `None` once the journal closed it.
    subscription: Option<EngagementSubscription>,
    /// When the store's file was last checked (see `check_health`).
    health_checked: Instant,
    /// Whether the next step reads the store (else it waits for a commit); see `wait`.
    must_read: bool,
    /// How many pages it read from the store (tests see that live events cost none).
    pages_read: u64,
    failed: bool,
}

impl JournalFeed {
    /// A feed from `start`, refused (400) when the engagement cannot be resumed there.
    async fn start(
        journal: Arc<dyn EngagementJournal>,
        hub: &JournalHub,
        engagement_id: String,
        start: &JournalStart,
    ) -> Result<Self, ApiError> {
        // Subscribe before the first read, so nothing committed in between is missed.
        let subscription = Some(hub.subscribe(&journal, &engagement_id));
        let first_read = check_resumable(journal.as_ref(), &engagement_id, start).await?;
        Ok(JournalFeed {
            subscription,
            first_read,
            journal,
            engagement_id,
            next_seq: start.next_seq,
            generation: start.generation,
            pending: VecDeque::new(),
            health_checked: Instant::now(),
            must_read: true,
            pages_read: 0,
            failed: false,
        })
    }

    async fn next_item(&mut self) -> Result<JournalItem, String> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Ok(item);
            }
            if let Some(failed) = check_health(&mut self.health_checked, || self.journal.health()) {
                return Err(failed);
            }
            if !self.must_read {
                self.wait().await;
                continue;
            }
            // Read what is stored from the next seq on (covers catch-up, lag, other processes).
            // A first read made from an earlier seq is as good: older events are skipped below.
            let tail = match self.first_read.take() {
                Some(tail) => tail,
                None => {
                    self.pages_read += 1;
                    self.journal
                        .read_tail(&self.engagement_id, self.next_seq, JOURNAL_PAGE)
                        .await
                        .map_err(|err| err.to_string())?
                }
            };
            match (self.generation, tail.generation) {
                (Some(held), current) if current != Some(held) => {
                    self.generation = current;
                    self.next_seq = 0;
                    self.pending.push_back(JournalItem::Resync {
                        generation: current,
                    });
                    continue;
                }
                (None, Some(current)) => self.generation = Some(current),
                _ => {}
            }
            if let Some(generation) = tail.generation {
                for event in tail.events {
                    if event.seq >= self.next_seq {
                        self.next_seq = event.seq + 1;
                        self.pending
                            .push_back(JournalItem::Event { event, generation });
                    }
                }
            }
            // A page that brought events may have stopped short of the end: read on. One that
            // brought none found the end: wait.
            self.must_read = !self.pending.is_empty();
        }
    }

    /// Caught up: wait for a commit on this engagement, the doorbell, or the safety-net
    /// timeout. A commit of the event that comes next in the numbering the client holds is
    /// queued as it is (nothing read: many clients of one busy engagement cost the store
    /// nothing each); anything else sets `must_read`.
    async fn wait(&mut self) {
        let recheck = tokio::time::sleep(RECHECK);
        tokio::pin!(recheck);
        loop {
            let delivered = async {
                match self.subscription.as_mut() {
                    Some(subscription) => subscription.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                delivery = delivered => match delivery {
                    Delivery::Event(committed) if self.generation == Some(committed.generation) => {
                        let seq = committed.event.seq;
                        if seq < self.next_seq {
                            // Already read from the store.
                            continue;
                        }
                        if seq == self.next_seq {
                            self.next_seq = seq + 1;
                            self.pending.push_back(JournalItem::Event {
                                event: committed.event,
                                generation: committed.generation,
                            });
                            return;
                        }
                        // Past the next: something in between came another way.
                        self.must_read = true;
                        return;
                    }
                    // Another numbering, or events missed: re-read from the database.
                    Delivery::Event(_) | Delivery::Missed => {
                        self.must_read = true;
                        return;
                    }
                    // The doorbell and the timeout go on; a last read sees what came before.
                    Delivery::Closed => {
                        self.subscription = None;
                        self.must_read = true;
                        return;
                    }
                },
                () = &mut recheck => {
                    self.must_read = true;
                    return;
                }
            }
        }
    }
}

fn journal_event(event: &EngagementEvent, generation: u64) -> SseEvent {
    let id = format!("{}@{generation}", event.seq);
    SseEvent::json("journal", Some(&id), event)
}

/// The `data:` of an engagement stream's `resync` event: the engagement's seqs were given out
/// again, and the events that follow on the same stream start again at seq 0.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JournalStreamResync {
    /// What happened and what the client does, in words.
    reason: &'static str,
    /// The seq the next `journal` event has: always 0.
    from_seq: i64,
}

fn journal_resync_event(generation: Option<u64>) -> SseEvent {
    let body = JournalStreamResync {
        reason: "the engagement was compacted or pruned: drop the events you hold; the events \
                 that follow start again at seq 0",
        from_seq: 0,
    };
    let id = generation.map(|generation| format!("-1@{generation}"));
    SseEvent::json("resync", id.as_deref(), &body)
}

/// An engagement's events from `fromSeq` on, then live ones as they commit (Server-Sent Events).
///
/// `event: journal` with an `EngagementEvent` as `data:`, one per event, in seq order; `id:` is
/// `<seq>@<generation>`, and a reconnect with `Last-Event-ID` resumes after it. `event: resync`
/// when the engagement's seqs were given out again (a compaction renumbers it; a prune deletes
/// it and a later append starts it anew): the client drops what it holds, and the events that
/// follow on the same stream start again at seq 0. A reconnect whose `Last-Event-ID` names an
/// older generation gets the same `resync` first; one that names an event the engagement does
/// not hold in its current numbering (or a `fromSeq` past its end) is refused with 400, as a
/// silent wait for that seq would skip every event up to it.
#[utoipa::path(
    get,
    path = "/v1/engagements/{engagementId}/stream",
    tag = tags::STREAMS,
    operation_id = "engagementStream",
    params(
        ("engagementId" = String, Path, description = ENGAGEMENT_ID),
        FromSeqQuery,
        ("Last-Event-ID" = Option<String>, Header, description = JOURNAL_LAST_EVENT_ID, nullable = false, pattern = r"^\s*([0-9]{0,18}|(-1|[0-9]{1,18})@[0-9]{1,19})\s*$"),
    ),
    responses(
        (status = 200, description = "The event stream (`journal`, `resync`, `error` events).", content_type = "text/event-stream", body = String),
        (status = 400, description = "A bad id, `fromSeq` or `Last-Event-ID`, or a start past the engagement's end (no event with the seq before it in the numbering named).", body = ErrorBody),
        (status = 503, description = STORE_LOST, body = ErrorBody),
    ),
)]
async fn journal_stream(
    State(state): State<AppState>,
    headers: HeaderMap,
    PathId(engagement_id): PathId,
    ApiQuery(query): ApiQuery<FromSeqQuery>,
) -> Result<impl IntoResponse, ApiError> {
    // Both are checked, whichever wins: a bad `fromSeq` is a 400 with or without the header.
    if query.from_seq.is_some_and(|from| from < 0) {
        return Err(ApiError::invalid("fromSeq must be a non-negative integer"));
    }
    if query
        .generation
        .is_some_and(|generation| generation > LARGEST_SEQ as u64)
    {
        return Err(ApiError::invalid(
            "generation must be an integer from 0 to 2^53 - 1: the part after '@' of an event \
             id this stream sent",
        ));
    }
    let start = match (journal_last_event_id(&headers)?, query.from_seq) {
        (Some(start), _) => start,
        (None, from) => JournalStart {
            next_seq: from.unwrap_or(0),
            generation: query.generation,
            from_last_event_id: false,
        },
    };
    let journal = state.journal().clone();
    journal.health()?;
    let place = state.open_stream()?;
    let feed = JournalFeed::start(journal, state.journal_hub(), engagement_id, &start).await?;
    let ends = state.metrics().stream_ends(StreamKind::Journal);
    let events = stream::unfold((feed, ends), |(mut feed, ends)| async move {
        if feed.failed {
            return None;
        }
        let sse_event = match feed.next_item().await {
            Ok(JournalItem::Event { event, generation }) => journal_event(&event, generation),
            // Not an end: the stream goes on from seq 0.
            Ok(JournalItem::Resync { generation }) => {
                ends.resync_sent.inc();
                journal_resync_event(generation)
            }
            Err(message) => {
                feed.failed = true;
                ends.error.inc();
                error_event(&message)
            }
        };
        Some((sse_event, (feed, ends)))
    });
    Ok(sse(&state, StreamKind::Journal, place, events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_stream_follows_from_the_horizon_only_when_it_held_still_during_the_snapshot() {
        // Nothing pruned: the cursor.
        assert_eq!(follow_from_snapshot(10, 0, 0), 10);
        // The newest changes were pruned before the snapshot (cursor 10, ids 11 and 12 gone):
        // just below the horizon, so reconnecting there is not a resync.
        assert_eq!(follow_from_snapshot(10, 13, 13), 12);
        // A prune committed during the snapshot read: ids below the new horizon may include
        // this run's changes after the snapshot, so the stream starts at the cursor (and the
        // feed's horizon check says resync if anything after it is gone).
        assert_eq!(follow_from_snapshot(10, 0, 20), 10);
        assert_eq!(follow_from_snapshot(10, 13, 20), 10);
    }

    fn start(span_id: &str, run_id: &str, at: i64) -> flightlog_core::activity::StartSpanInput {
        flightlog_core::activity::StartSpanInput {
            span_id: span_id.into(),
            run_id: run_id.into(),
            parent_span_id: None,
            name: "turn".into(),
            kind: flightlog_core::activity::SpanKind::Turn,
            origin: flightlog_core::activity::SpanOrigin::Session,
            session_id: None,
            job_name: None,
            attrs: None,
            started_at: Some(at),
        }
    }

    /// The run stream of `run_id` from where `snapshot` (of that run) left it, woken by `hub`.
    fn feed_after_snapshot(
        store: &Arc<dyn ActivityStore>,
        snapshot: &flightlog_core::activity::RunSnapshot,
        run_id: &str,
        hub: &RunHub,
    ) -> ChangeFeed {
        let follow = RunFilter {
            run_id: run_id.into(),
            above_seq: Some(snapshot.high_water_seq),
        };
        ChangeFeed::for_run(Arc::clone(store), snapshot.change_cursor, follow, hub)
    }

    /// A SQLite activity store in `dir` on a manual clock at 1,000, acting as writer `w`, with
    /// run `run_id` of one root span, and the run's snapshot.
    async fn store_with_a_run(
        dir: &std::path::Path,
        root: &str,
        run_id: &str,
    ) -> (
        Arc<dyn ActivityStore>,
        flightlog_core::activity::RunSnapshot,
    ) {
        let db = flightlog_sqlite::SqliteDatabase::open(flightlog_sqlite::SqliteConfig::new(
            dir.join("s.db"),
        ))
        .expect("open");
        let clock = Arc::new(flightlog_core::ManualClock::new(1_000));
        let store: Arc<dyn ActivityStore> = Arc::new(
            flightlog_sqlite::SqliteActivityStore::with_identity(db, clock, "w"),
        );
        store
            .start_span(start(root, run_id, 1_000))
            .await
            .expect("start the run");
        let snapshot = store
            .snapshot_run(run_id)
            .await
            .expect("snapshot")
            .expect("the run");
        (store, snapshot)
    }

    /// Run `y`, written after whatever the store holds, ended, rolled up and pruned: its
    /// changes are deleted and the change log's horizon passes them.
    async fn write_and_prune_another_run(store: &dyn ActivityStore) {
        write_and_end_another_run(store).await;
        assert_eq!(prune_ended_runs(store).await, 1);
    }

    /// Run `y`, written after whatever the store holds, ended and rolled up.
    async fn write_and_end_another_run(store: &dyn ActivityStore) {
        use flightlog_core::activity::{EndSpanInput, SpanOutcome};
        store
            .start_span(start("y-root", "y", 1_000))
            .await
            .expect("start y");
        let ended = EndSpanInput {
            outcome: SpanOutcome::Success,
            reason: None,
            ended_at: Some(1_100),
            usage: None,
            attrs: None,
        };
        assert!(store.end_span("y-root", ended).await.expect("end y"));
        store.rollup_run("y").await.expect("roll up y");
    }

    /// Prune the runs ended and rolled up at 1,100 (their detail past the digest floor); how
    /// many were pruned.
    async fn prune_ended_runs(store: &dyn ActivityStore) -> i64 {
        use flightlog_core::activity::PruneOptions;
        store
            .prune(PruneOptions {
                digest_floor_at: 5_000,
                hard_ceiling_ms: 1_000_000,
                now: Some(6_000),
                batch: None,
                max_spans: None,
                scheduled: false,
            })
            .await
            .expect("prune")
            .runs_pruned
    }

    /// Start a child of `root` in `run`, and the change the run stream `feed` gives next,
    /// within `within`.
    async fn child_change(
        store: &dyn ActivityStore,
        feed: &mut ChangeFeed,
        (root, run): (&str, &str),
        within: Duration,
    ) -> ActivityChange {
        let mut child = start(&format!("{root}-child"), run, 1_100);
        child.parent_span_id = Some(root.into());
        store.start_span(child).await.expect("start a child");
        let next = tokio::time::timeout(within, feed.next_change())
            .await
            .expect("the run's change in time");
        match next {
            Ok(change) => change,
            Err(FeedEnd::Resync { reason, .. }) => panic!("resync: {reason}"),
            Err(_) => panic!("the run stream ended"),
        }
    }

    /// The change ids of a global feed's next events (one or more), within 5 s.
    async fn next_ids(feed: &mut GlobalFeed) -> Vec<i64> {
        let event = tokio::time::timeout(Duration::from_secs(5), feed.next_events())
            .await
            .expect("events within 5 s");
        let Ok(event) = event else {
            panic!("the feed ended");
        };
        let text = String::from_utf8(event.into_bytes()).expect("UTF-8");
        text.lines()
            .filter_map(|line| line.strip_prefix("id: "))
            .map(|id| id.parse().expect("a change id"))
            .collect()
    }

    /// A feed from `cursor`, read until it has nothing new (so it follows the tail).
    async fn caught_up_feed(
        store: &Arc<dyn ActivityStore>,
        tail: &Arc<ChangeTail>,
        cursor: i64,
    ) -> GlobalFeed {
        let mut feed = GlobalFeed::new(Arc::clone(store), Arc::clone(tail), cursor);
        assert_eq!(drain(&mut feed).await, Vec::<i64>::new());
        feed
    }

    /// Read `feed` until it has nothing new for 100 ms (it is then following the tail, or
    /// waiting on its own), returning the ids it gave.
    async fn drain(feed: &mut GlobalFeed) -> Vec<i64> {
        let mut ids = Vec::new();
        while let Ok(Ok(event)) =
            tokio::time::timeout(Duration::from_millis(100), feed.next_events()).await
        {
            let text = String::from_utf8(event.into_bytes()).expect("UTF-8");
            ids.extend(
                text.lines()
                    .filter_map(|line| line.strip_prefix("id: "))
                    .map(|id| id.parse::<i64>().expect("a change id")),
            );
        }
        ids
    }

    /// Clients at the head of the log share the tail's reading: after they caught up, new
    /// changes reach every one of them, in order, with no read of the log of their own.
    #[tokio::test]
    async fn clients_at_the_head_share_one_reading_of_each_commit() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, snapshot) = store_with_a_run(dir.path(), "a-root", "a").await;
        let tail = Arc::new(ChangeTail::default());
        let mut feeds: Vec<GlobalFeed> = (0..5)
            .map(|_| {
                GlobalFeed::new(
                    Arc::clone(&store),
                    Arc::clone(&tail),
                    snapshot.change_cursor,
                )
            })
            .collect();
        for feed in &mut feeds {
            assert_eq!(drain(feed).await, Vec::<i64>::new());
        }
        let own_reads: Vec<u64> = feeds.iter().map(|feed| feed.own.pages_read).collect();
        let tail_reads = tail.pages_read();
        let mut written = Vec::new();
        for k in 0..20 {
            let span = store
                .start_span(start(&format!("b{k}"), &format!("b{k}"), 2_000))
                .await
                .expect("start");
            written.push(span.span_id);
        }
        let newest = store.latest_change_cursor().await.expect("cursor");
        let expected: Vec<i64> = (snapshot.change_cursor + 1..=newest).collect();
        assert_eq!(expected.len(), 20);
        for feed in &mut feeds {
            let mut got = Vec::new();
            while got.len() < expected.len() {
                got.extend(next_ids(feed).await);
            }
            assert_eq!(got, expected);
        }
        for (feed, before) in feeds.iter().zip(own_reads) {
            assert_eq!(feed.own.pages_read, before, "a client read the log itself");
        }
        // At most one read a commit (the first client woken), not one a client.
        let tail_reads = tail.pages_read() - tail_reads;
        assert!((1..=20).contains(&tail_reads), "{tail_reads} reads");
    }

    /// A client behind the tail's oldest frame reads the database itself from its cursor, and
    /// follows the tail once it reaches it: every change once, in order.
    #[tokio::test]
    async fn a_client_behind_the_tail_catches_up_on_its_own_then_joins_it() {
        use flightlog_core::activity::ActivityWrite;
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, snapshot) = store_with_a_run(dir.path(), "a-root", "a").await;
        let tail = Arc::new(ChangeTail::default());
        let mut leader = caught_up_feed(&store, &tail, snapshot.change_cursor).await;
        let count = crate::change_tail::MAX_ENTRIES + 600;
        let writes = (0..count)
            .map(|k| ActivityWrite::StartSpan(start(&format!("c{k}"), &format!("c{k}"), 2_000)))
            .collect();
        for result in store.write_batch(writes).await {
            result.expect("start");
        }
        let newest = store.latest_change_cursor().await.expect("cursor");
        let expected: Vec<i64> = (snapshot.change_cursor + 1..=newest).collect();
        let mut got = Vec::new();
        while got.len() < expected.len() {
            got.extend(next_ids(&mut leader).await);
        }
        assert_eq!(got, expected);
        // The tail now starts past the first changes: a client at the old cursor reads itself.
        assert!(tail.take(snapshot.change_cursor).is_none());
        let mut late = GlobalFeed::new(
            Arc::clone(&store),
            Arc::clone(&tail),
            snapshot.change_cursor,
        );
        let mut got = Vec::new();
        while got.len() < expected.len() {
            got.extend(next_ids(&mut late).await);
        }
        assert_eq!(got, expected);
        assert!(late.own.pages_read > 0);
        // Caught up on its own (its cursor has long been inside the tail: it reads the database
        // until it finds nothing more), it joins the tail: the next change comes from there.
        assert_eq!(drain(&mut late).await, Vec::<i64>::new());
        let own_reads = late.own.pages_read;
        store
            .start_span(start("d", "d", 3_000))
            .await
            .expect("start d");
        assert_eq!(next_ids(&mut late).await, vec![newest + 1]);
        assert_eq!(late.own.pages_read, own_reads);
    }

    /// A client that comes back after a prune deleted changes the tail still holds (no commit
    /// since, so the tail has not read again) is told to resync, as the change pages say, and
    /// not sent the pruned run's changes; once the tail reads again it forgets them.
    #[tokio::test]
    async fn a_client_that_comes_back_after_a_prune_is_told_to_resync_not_sent_the_tail() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, snapshot) = store_with_a_run(dir.path(), "a-root", "a").await;
        let tail = Arc::new(ChangeTail::default());
        let mut leader = caught_up_feed(&store, &tail, snapshot.change_cursor).await;
        write_and_end_another_run(store.as_ref()).await;
        let ids = drain(&mut leader).await;
        assert_eq!(ids.len(), 2, "y's start and end: {ids:?}");
        assert!(tail.take(snapshot.change_cursor).is_some(), "in the tail");
        assert_eq!(prune_ended_runs(store.as_ref()).await, 1);

        let mut back = GlobalFeed::new(
            Arc::clone(&store),
            Arc::clone(&tail),
            snapshot.change_cursor,
        );
        let next = tokio::time::timeout(Duration::from_secs(5), back.next_events())
            .await
            .expect("within 5 s");
        assert!(matches!(next, Err(FeedEnd::Resync { .. })), "{next:?}");

        // The leader, at the head, reads on past the prune: the tail forgets y's changes.
        store
            .start_span(start("b-root", "b", 7_000))
            .await
            .expect("start b");
        assert_eq!(drain(&mut leader).await.len(), 1);
        assert!(tail.take(snapshot.change_cursor).is_none(), "forgotten");
    }

    /// A client resuming inside the tail gets each span as it is now (as the change pages
    /// give it), not as the tail read it at its change.
    #[tokio::test]
    async fn a_client_resuming_inside_the_tail_gets_each_span_as_it_is_now() {
        use flightlog_core::activity::{EndSpanInput, SpanOutcome};
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, snapshot) = store_with_a_run(dir.path(), "a-root", "a").await;
        let tail = Arc::new(ChangeTail::default());
        let mut leader = caught_up_feed(&store, &tail, snapshot.change_cursor).await;
        store
            .start_span(start("t", "a", 1_200))
            .await
            .expect("start t");
        assert_eq!(drain(&mut leader).await.len(), 1);
        let ended = EndSpanInput {
            outcome: SpanOutcome::Error,
            reason: Some("boom".into()),
            ended_at: Some(1_300),
            usage: None,
            attrs: None,
        };
        assert!(store.end_span("t", ended).await.expect("end t"));
        assert_eq!(drain(&mut leader).await.len(), 1);

        let mut resumed = GlobalFeed::new(
            Arc::clone(&store),
            Arc::clone(&tail),
            snapshot.change_cursor,
        );
        let event = tokio::time::timeout(Duration::from_secs(5), resumed.next_events())
            .await
            .expect("within 5 s")
            .expect("events");
        let text = String::from_utf8(event.into_bytes()).expect("UTF-8");
        let first = text
            .lines()
            .find_map(|line| line.strip_prefix("data: "))
            .expect("a change");
        let change: serde_json::Value = serde_json::from_str(first).expect("JSON");
        assert_eq!(change["changeId"], snapshot.change_cursor + 1, "{change}");
        assert_eq!(change["span"]["outcome"], "error", "{change}");
    }

    /// A prune that deleted changes the tail had not read yet: the tail starts again past them,
    /// and its clients, outside it, read the database themselves and are told to resync, as a
    /// client reading for itself always was.
    #[tokio::test]
    async fn a_gap_behind_the_tail_sends_its_clients_to_resync() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, snapshot) = store_with_a_run(dir.path(), "z-root", "z").await;
        let tail = Arc::new(ChangeTail::default());
        let mut feed = caught_up_feed(&store, &tail, snapshot.change_cursor).await;
        assert!(
            tail.take(snapshot.change_cursor).is_some(),
            "following the tail"
        );
        write_and_prune_another_run(store.as_ref()).await;
        let next = tokio::time::timeout(Duration::from_secs(5), feed.next_events())
            .await
            .expect("within 5 s");
        assert!(matches!(next, Err(FeedEnd::Resync { .. })), "{next:?}");
    }

    /// A run stream whose cursor a prune of *other* runs left behind the change log's horizon
    /// goes on with its run's next change: nothing of its run was deleted (it used to end with
    /// a `resync`, and its client took a snapshot again for nothing). The change stream, which
    /// follows every run, resyncs there, as it must.
    #[tokio::test]
    async fn a_run_stream_goes_on_across_a_prune_of_other_runs() {
        use flightlog_core::activity::SpanPatch;
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, snapshot) = store_with_a_run(dir.path(), "z-root", "z").await;
        // Another run after the snapshot: ended, rolled up and pruned, so its changes (newer
        // than the snapshot's cursor) are deleted and the horizon passes the cursor.
        write_and_prune_another_run(store.as_ref()).await;
        let horizon = store.change_log_horizon().await.expect("horizon");
        assert!(horizon > snapshot.change_cursor + 1, "{horizon}");
        let patch = SpanPatch {
            attrs: None,
            usage: None,
            wait_until: Some(9_000),
        };
        assert!(store.patch_span("z-root", patch).await.expect("patch z"));

        let hub = RunHub::default();
        let mut run_feed = feed_after_snapshot(&store, &snapshot, "z", &hub);
        let next = tokio::time::timeout(Duration::from_secs(5), run_feed.next_change())
            .await
            .expect("within 5 s");
        let Ok(change) = next else {
            panic!("the run stream ended instead of going on");
        };
        assert_eq!(
            (change.run_id.as_str(), change.seq),
            ("z", snapshot.high_water_seq + 1)
        );

        let mut change_feed = ChangeFeed::new(store, snapshot.change_cursor, None);
        let next = tokio::time::timeout(Duration::from_secs(5), change_feed.next_change())
            .await
            .expect("within 5 s");
        assert!(matches!(next, Err(FeedEnd::Resync { .. })));
    }

    /// A run stream on a quiet run reads none of the other runs' changes: it asks for its run's
    /// newest change after each commit and reads the log only when the run moved (200 such
    /// streams took a core at 2,000 writes/s, reading every commit's page each). Its run's
    /// next change still comes, exactly once.
    #[tokio::test]
    async fn a_run_stream_on_a_quiet_run_reads_no_other_runs_changes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, snapshot) = store_with_a_run(dir.path(), "quiet-root", "quiet").await;
        let hub = RunHub::default();
        let mut feed = feed_after_snapshot(&store, &snapshot, "quiet", &hub);
        for index in 0..20 {
            store
                .start_span(start(&format!("busy-{index}"), "busy", 1_000))
                .await
                .expect("start a busy span");
        }
        let waited = tokio::time::timeout(Duration::from_millis(300), feed.next_change()).await;
        assert!(waited.is_err(), "the quiet run logged nothing new");
        assert_eq!(
            feed.pages_read, 0,
            "no page of the other run's changes read"
        );
        let newest = store.latest_change_cursor().await.expect("cursor");
        assert_eq!(
            feed.cursor, newest,
            "the cursor passed the other run's changes"
        );

        let change = child_change(
            store.as_ref(),
            &mut feed,
            ("quiet-root", "quiet"),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(
            (change.run_id.as_str(), change.seq),
            ("quiet", snapshot.high_water_seq + 1)
        );
        assert_eq!(
            feed.pages_read, 1,
            "one page, from past the other run's changes"
        );
    }

    /// A SQLite journal in `dir` with engagement `e` of `events` events.
    async fn journal_with(dir: &std::path::Path, events: i64) -> Arc<dyn EngagementJournal> {
        let db = flightlog_sqlite::SqliteDatabase::open(flightlog_sqlite::SqliteConfig::new(
            dir.join("j.db"),
        ))
        .expect("open");
        let journal: Arc<dyn EngagementJournal> = Arc::new(
            flightlog_sqlite::SqliteEngagementJournal::new(db, Default::default()),
        );
        for at in 0..events {
            append_note(journal.as_ref(), at).await;
        }
        journal
    }

    async fn append_note(journal: &dyn EngagementJournal, at: i64) -> EngagementEvent {
        journal
            .append_json(serde_json::json!({"engagementId": "e", "at": at, "type": "note", "data": {"n": at}}))
            .await
            .expect("append")
    }

    /// What a journal feed gives until it has nothing new for 100 ms: `seq@generation` for
    /// each event, `resync@generation` for a resync.
    async fn drain_journal(feed: &mut JournalFeed) -> Vec<String> {
        let mut items = Vec::new();
        while let Ok(item) =
            tokio::time::timeout(Duration::from_millis(100), feed.next_item()).await
        {
            items.push(match item.expect("the feed goes on") {
                JournalItem::Event { event, generation } => format!("{}@{generation}", event.seq),
                JournalItem::Resync { generation } => format!("resync@{generation:?}"),
            });
        }
        items
    }

    fn from_seq_zero() -> JournalStart {
        JournalStart {
            next_seq: 0,
            generation: None,
            from_last_event_id: false,
        }
    }

    /// Clients of one engagement take each new event as its commit publishes it: after the
    /// catch-up, 20 appends reach each of 5 clients, in order, with no read of the store (the
    /// old feed read the engagement once per client per commit: 100 clients held the appends to
    /// 632 a second).
    #[tokio::test]
    async fn clients_of_one_engagement_take_new_events_without_reading_the_store() {
        let dir = tempfile::tempdir().expect("temp dir");
        let journal = journal_with(dir.path(), 3).await;
        // The doorbell rings after every commit, this process's own too, and the hub's look at
        // the heads after it may find them ahead of the events routed so far (a read for
        // nothing, tested in `journal_hub`): what is measured here is what routed events cost.
        let hub = JournalHub::deaf_to_the_doorbell();
        let mut feeds = Vec::new();
        for _ in 0..5 {
            let feed = JournalFeed::start(Arc::clone(&journal), &hub, "e".into(), &from_seq_zero())
                .await
                .expect("the feed starts");
            feeds.push(feed);
        }
        let generation = journal
            .read_tail("e", 0, TailBound::ALL)
            .await
            .expect("read")
            .generation
            .expect("a generation");
        let caught_up: Vec<String> = (0..3).map(|seq| format!("{seq}@{generation}")).collect();
        for feed in &mut feeds {
            assert_eq!(drain_journal(feed).await, caught_up);
        }
        let reads_before: Vec<u64> = feeds.iter().map(|feed| feed.pages_read).collect();
        for at in 3..23 {
            append_note(journal.as_ref(), at).await;
        }
        let live: Vec<String> = (3..23).map(|seq| format!("{seq}@{generation}")).collect();
        for (feed, before) in feeds.iter_mut().zip(reads_before) {
            assert_eq!(drain_journal(feed).await, live);
            assert_eq!(feed.pages_read, before, "live events cost no read");
        }
    }

    /// A published event is taken as the next one only in the numbering the client holds: an
    /// engagement pruned and written again has seqs 0, 1, … anew, and a client that held seq 0
    /// of the old numbering and sees the new seq 1 published before the prune's doorbell rang
    /// gets a resync and the new events, never the new seq 1 as the old one's next.
    #[tokio::test]
    async fn an_event_of_another_numbering_sends_the_client_to_the_store() {
        let dir = tempfile::tempdir().expect("temp dir");
        let journal = journal_with(dir.path(), 1).await;
        // The prune's ring never heard: only the published events tell.
        let hub = JournalHub::deaf_to_the_doorbell();
        let mut feed = JournalFeed::start(Arc::clone(&journal), &hub, "e".into(), &from_seq_zero())
            .await
            .expect("the feed starts");
        let old = journal
            .read_tail("e", 0, TailBound::ALL)
            .await
            .expect("read")
            .generation
            .expect("a generation");
        assert_eq!(drain_journal(&mut feed).await, [format!("0@{old}")]);
        assert_eq!(journal.prune(i64::MAX / 2).await.expect("prune"), 1);
        append_note(journal.as_ref(), 10).await;
        append_note(journal.as_ref(), 11).await;
        let new = journal
            .read_tail("e", 0, TailBound::ALL)
            .await
            .expect("read")
            .generation
            .expect("a generation");
        assert_ne!(new, old);
        assert_eq!(
            drain_journal(&mut feed).await,
            [
                format!("resync@Some({new})"),
                format!("0@{new}"),
                format!("1@{new}")
            ]
        );
    }

    /// A run stream looks at the store only when its run may have moved: commits of other runs
    /// wake it not at all (it looked after every one of them, two probes each: 200 streams on
    /// quiet runs took a core at 1,000 writes/s), a prune of another run wakes it (a prune
    /// may delete what no change says), and its own run's change wakes it and comes.
    #[tokio::test]
    async fn a_run_stream_looks_only_when_its_run_may_have_moved() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, snapshot) = store_with_a_run(dir.path(), "q-root", "q").await;
        let hub = RunHub::default();
        let mut feed = feed_after_snapshot(&store, &snapshot, "q", &hub);
        assert_eq!(hub.routes(), 1);
        // The hub's first look wakes every stream (it knows no horizon yet): let it pass.
        store
            .start_span(start("other-0", "other", 1_000))
            .await
            .expect("start");
        after_first_look(&hub, &mut feed).await;
        // Commits of another run while the stream waits: it looks once as `next_change` begins,
        // and never for them.
        let looks = feed.looks;
        let other_runs = async {
            for index in 1..40 {
                store
                    .start_span(start(&format!("other-{index}"), "other", 1_000))
                    .await
                    .expect("start");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (waited, ()) = tokio::join!(
            tokio::time::timeout(Duration::from_millis(500), feed.next_change()),
            other_runs
        );
        assert!(waited.is_err(), "nothing of q yet");
        assert_eq!(
            feed.looks,
            looks + 1,
            "no look for 39 commits of another run"
        );

        // A prune of another run while it waits wakes it. The stream waits until the prune's
        // four writes are done and the watcher (every 40 ms) has had time to ring for it: a
        // fixed 300 ms was not always enough on a busy machine.
        let looks = feed.looks;
        let prune = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            write_and_prune_another_run(store.as_ref()).await;
            tokio::time::sleep(Duration::from_millis(1_000)).await;
        };
        let waited = tokio::select! {
            change = feed.next_change() => Some(change),
            () = prune => None,
        };
        assert!(waited.is_none(), "the prune took nothing of q");
        assert!(feed.looks >= looks + 2, "the prune woke the stream");

        let change = child_change(
            store.as_ref(),
            &mut feed,
            ("q-root", "q"),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(
            (change.run_id.as_str(), change.seq),
            ("q", snapshot.high_water_seq + 1)
        );
        drop(feed);
        assert_eq!(hub.routes(), 0, "the route goes with its last stream");
    }

    /// Wait for the hub's first look (it wakes every stream), then let `feed` take it.
    async fn after_first_look(hub: &RunHub, feed: &mut ChangeFeed) {
        let first_look = tokio::time::Instant::now() + Duration::from_secs(5);
        while hub.looks() == 0 && tokio::time::Instant::now() < first_look {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(hub.looks() > 0, "the hub looked");
        let settled = tokio::time::timeout(Duration::from_millis(300), feed.next_change()).await;
        assert!(settled.is_err(), "nothing of the run yet");
    }

    /// Start `count` spans of other runs in bursts, pausing between them so the hub looks.
    async fn other_runs_write(store: &dyn ActivityStore, prefix: &str, count: usize) {
        for index in 0..count {
            store
                .start_span(start(
                    &format!("{prefix}-{index}"),
                    &format!("{prefix}-{}", index / 50),
                    1_000,
                ))
                .await
                .expect("start");
            if index % 100 == 99 {
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    /// A stream that was not woken for seconds of other runs' commits reads from where its run
    /// moved when it does, not every change since its last look (600 changes of other runs
    /// were two pages, and at 10,000 writes/s a quiet run's change took 100 ms and more to
    /// reach its stream: an audit's finding).
    #[tokio::test]
    async fn a_quiet_run_stream_reads_from_where_its_run_moved() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, snapshot) = store_with_a_run(dir.path(), "r-root", "r").await;
        let hub = RunHub::default();
        let mut feed = feed_after_snapshot(&store, &snapshot, "r", &hub);
        store
            .start_span(start("first-other", "first-other", 1_000))
            .await
            .expect("start");
        after_first_look(&hub, &mut feed).await;
        let pages = feed.pages_read;
        other_runs_write(store.as_ref(), "other", 3 * PAGE as usize / 2).await;
        let change = child_change(
            store.as_ref(),
            &mut feed,
            ("r-root", "r"),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(
            (change.run_id.as_str(), change.seq),
            ("r", snapshot.high_water_seq + 1)
        );
        assert_eq!(feed.pages_read, pages + 1, "one page, from where r moved");
    }

    /// A stream resumed with `Last-Event-ID` (it knows no seq of its run) goes on across a
    /// prune of another run that wrote after it last looked: the ids the hub looked through
    /// without a change of its run are behind it, so the horizon the prune moved is not past
    /// its cursor (it took the prune as a gap and resynced, 8 times of 8: an audit's finding).
    #[tokio::test]
    async fn a_resumed_run_stream_goes_on_across_a_prune_of_another_run() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, _) = store_with_a_run(dir.path(), "s-root", "s").await;
        let resume_from = store.latest_change_cursor().await.expect("cursor");
        let follow = RunFilter {
            run_id: "s".into(),
            above_seq: None,
        };
        let hub = RunHub::default();
        let mut feed = ChangeFeed::for_run(Arc::clone(&store), resume_from, follow, &hub);
        store
            .start_span(start("first-other", "first-other", 1_000))
            .await
            .expect("start");
        after_first_look(&hub, &mut feed).await;
        write_and_end_another_run(store.as_ref()).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(prune_ended_runs(store.as_ref()).await, 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let change = child_change(
            store.as_ref(),
            &mut feed,
            ("s-root", "s"),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(change.run_id, "s");
    }
}
