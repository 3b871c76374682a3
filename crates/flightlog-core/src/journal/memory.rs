//! The in-memory engagement journal: the reference's `InMemoryEngagementJournal`, safe to share
//! between threads and fast enough to sit on an agent's hot path.
//!
//! Engagements live in a fixed number of shards, each behind a std `Mutex` (never held across an
//! `.await`: every operation here is synchronous, so a tokio mutex would only add cost). An
//! engagement's appends and its compaction take its shard's lock, which serializes them in call
//! order and makes compaction atomic, while engagements in other shards proceed in parallel.
//! Events are broadcast while the shard lock is still held, so subscribers see each engagement's
//! events in seq order, and only after they are committed to the log.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use hashbrown::HashTable;
use tokio::sync::{broadcast, watch};

use super::compaction::plan_compaction;
use super::store::{
    CommittedEvent, EngagementHead, EngagementJournal, JournalDoorbell, JournalError,
    JournalSubscription, JournalTail, TailBound,
};
use super::summary::summarize_engagement_events;
use super::types::{EngagementEvent, EngagementSummary, RetentionConfig};
use super::validate::AppendInput;

/// Shards of the engagement map.
const SHARD_COUNT: usize = 64;

/// Events a subscriber may fall behind before it lags (see [`JournalSubscription`]).
pub const DEFAULT_SUBSCRIBER_BUFFER: usize = 4096;
/// The largest subscriber buffer a journal takes (a larger one is clamped to it): the channel
/// allocates every slot up front, and tokio refuses more than `usize::MAX / 2`.
pub const MAX_SUBSCRIBER_BUFFER: usize = 1 << 20;

/// One engagement's log.
struct Log {
    /// The engagement id, shared by all its events.
    id: Arc<str>,
    /// `hash_one(id)`, kept so the table never rehashes an id.
    hash: u64,
    /// Events in seq order; `events[i].seq == i`. Never empty.
    events: Vec<EngagementEvent>,
    /// When the engagement was (re)created, as a journal-wide counter: the recency tie-break.
    created: u64,
    /// Its numbering's generation (see `EngagementJournal::read_tail`): `created`, then a new
    /// value of the same counter at each compaction, so no two numberings share one.
    generation: u64,
}

/// Engagements of one shard, keyed by their id's hash (computed once per call).
type Shard = HashTable<Log>;

/// A journal held in memory, lost when dropped. See the module docs for its locking.
pub struct InMemoryEngagementJournal {
    retention: RetentionConfig,
    shards: Box<[Mutex<Shard>]>,
    /// Keyed (SipHash) so clients choosing engagement ids cannot force collisions.
    hasher: RandomState,
    creations: AtomicU64,
    committed: broadcast::Sender<CommittedEvent>,
    /// Rung by compactions and prunes (see [`JournalDoorbell`]).
    rewrites: watch::Sender<u64>,
}

impl std::fmt::Debug for InMemoryEngagementJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryEngagementJournal")
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl Default for InMemoryEngagementJournal {
    fn default() -> Self {
        Self::new(RetentionConfig::default())
    }
}

impl InMemoryEngagementJournal {
    /// An empty journal enforcing `retention`.
    pub fn new(retention: RetentionConfig) -> Self {
        Self::with_subscriber_buffer(retention, DEFAULT_SUBSCRIBER_BUFFER)
    }

    /// An empty journal whose subscribers may fall `buffer` events behind before they lag
    /// (1 to [`MAX_SUBSCRIBER_BUFFER`]).
    pub fn with_subscriber_buffer(retention: RetentionConfig, buffer: usize) -> Self {
        let (committed, _) = broadcast::channel(buffer.clamp(1, MAX_SUBSCRIBER_BUFFER));
        Self {
            retention,
            shards: (0..SHARD_COUNT).map(|_| Mutex::new(Shard::new())).collect(),
            hasher: RandomState::new(),
            creations: AtomicU64::new(0),
            committed,
            rewrites: watch::Sender::new(0),
        }
    }

    /// The id's hash and its shard, locked. The shard comes from bits 32..38 of the hash, which
    /// the table uses for neither its bucket index (low bits) nor its tags (top 7 bits).
    fn shard(&self, engagement_id: &str) -> (u64, MutexGuard<'_, Shard>) {
        let hash = self.hasher.hash_one(engagement_id);
        let index = (hash >> 32) as usize % SHARD_COUNT;
        (hash, lock(&self.shards[index]))
    }

    /// Run `f` over the engagement's events (empty for an unknown engagement) under its lock,
    /// without copying them.
    fn with_events<T>(&self, engagement_id: &str, f: impl FnOnce(&[EngagementEvent]) -> T) -> T {
        let (hash, shard) = self.shard(engagement_id);
        let log = shard.find(hash, |log| *log.id == *engagement_id);
        f(log.map_or(&[], |log| log.events.as_slice()))
    }
}

/// A poisoned shard is still consistent: no operation panics between two writes of its state.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[async_trait]
impl EngagementJournal for InMemoryEngagementJournal {
    fn retention(&self) -> RetentionConfig {
        self.retention
    }

    async fn append(&self, input: AppendInput) -> Result<EngagementEvent, JournalError> {
        let (hash, mut shard) = self.shard(input.engagement_id());
        let log = shard.find_mut(hash, |log| *log.id == *input.engagement_id());
        let len = log.as_ref().map_or(0, |log| log.events.len());
        if len as u64 >= self.retention.max_events_per_engagement {
            return Err(JournalError::JournalFull {
                engagement_id: input.engagement_id().to_owned(),
                max_events: self.retention.max_events_per_engagement,
            });
        }
        let seq = len as i64;
        if let Some(expected) = input.expected_seq() {
            if expected != seq {
                return Err(JournalError::WrongExpectedSeq {
                    expected,
                    actual: seq,
                });
            }
        }
        let (event, generation) = match log {
            Some(log) => {
                let event = input.into_event_of(Arc::clone(&log.id), seq);
                log.events.push(event.clone());
                (event, log.generation)
            }
            None => {
                let event = input.into_event(seq);
                let created = self.creations.fetch_add(1, Ordering::Relaxed);
                let log = Log {
                    id: Arc::clone(&event.engagement_id),
                    hash,
                    events: vec![event.clone()],
                    created,
                    generation: created,
                };
                shard.insert_unique(hash, log, |log| log.hash);
                (event, created)
            }
        };
        // Committed; still under the shard lock, so subscribers see each engagement in seq
        // order. A send error only means nobody listens.
        if self.committed.receiver_count() > 0 {
            let _ = self.committed.send(CommittedEvent {
                event: event.clone(),
                generation,
            });
        }
        drop(shard);
        Ok(event)
    }

    async fn read(&self, engagement_id: &str) -> Result<Vec<EngagementEvent>, JournalError> {
        Ok(self.with_events(engagement_id, <[EngagementEvent]>::to_vec))
    }

    async fn read_from(
        &self,
        engagement_id: &str,
        from_seq: i64,
    ) -> Result<Vec<EngagementEvent>, JournalError> {
        Ok(self.with_events(engagement_id, |events| {
            // `events[i].seq == i`, so the tail is a slice.
            let start = usize::try_from(from_seq.max(0))
                .unwrap_or(usize::MAX)
                .min(events.len());
            events[start..].to_vec()
        }))
    }

    async fn read_tail(
        &self,
        engagement_id: &str,
        from_seq: i64,
        bound: TailBound,
    ) -> Result<JournalTail, JournalError> {
        let (hash, shard) = self.shard(engagement_id);
        let Some(log) = shard.find(hash, |log| *log.id == *engagement_id) else {
            return Ok(JournalTail::default());
        };
        let start = usize::try_from(from_seq.max(0))
            .unwrap_or(usize::MAX)
            .min(log.events.len());
        let mut events = Vec::new();
        let mut bytes = 0usize;
        for event in &log.events[start..] {
            if bound.reached(events.len(), bytes) {
                break;
            }
            if bound.max_bytes != usize::MAX {
                bytes = bytes.saturating_add(json_text_len(&event.data));
            }
            events.push(event.clone());
        }
        Ok(JournalTail {
            generation: Some(log.generation),
            events,
        })
    }

    async fn heads(
        &self,
        engagement_ids: &[Arc<str>],
    ) -> Result<Vec<Option<EngagementHead>>, JournalError> {
        Ok(engagement_ids
            .iter()
            .map(|engagement_id| {
                let (hash, shard) = self.shard(engagement_id);
                shard
                    .find(hash, |log| *log.id == **engagement_id)
                    .map(|log| EngagementHead {
                        generation: log.generation,
                        next_seq: log.events.len() as i64,
                    })
            })
            .collect())
    }

    async fn summarize(
        &self,
        engagement_id: &str,
    ) -> Result<Option<EngagementSummary>, JournalError> {
        // Summarized under the lock, straight from the log: cheaper than copying it out.
        Ok(self.with_events(engagement_id, |events| {
            (!events.is_empty()).then(|| summarize_engagement_events(engagement_id, events))
        }))
    }

    async fn compact(&self, engagement_id: &str) -> Result<bool, JournalError> {
        let (hash, mut shard) = self.shard(engagement_id);
        let Some(log) = shard.find_mut(hash, |log| *log.id == *engagement_id) else {
            return Ok(false);
        };
        let Some(plan) = plan_compaction(&log.events)? else {
            return Ok(false);
        };
        let events = std::mem::take(&mut log.events);
        log.events = plan.apply(events);
        log.generation = self.creations.fetch_add(1, Ordering::Relaxed);
        drop(shard);
        self.rewrites.send_modify(|rung| *rung += 1);
        Ok(true)
    }

    async fn list_engagements(&self, limit: Option<i64>) -> Result<Vec<String>, JournalError> {
        // One shard locked at a time, and only to copy what the order needs: with every shard
        // held through the collection and the sort, a listing of a million engagements (200 ms)
        // held up appends to every engagement for as long (measured: worst append 217 ms, 63 us
        // without the listing). An engagement appended to during the listing is listed at the
        // recency its shard had when read.
        let mut entries: Vec<(Arc<str>, i64, u64)> = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            entries.extend(
                shard.iter().filter_map(|log| {
                    Some((Arc::clone(&log.id), log.events.last()?.at, log.created))
                }),
            );
        }
        entries.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)));
        if let Some(limit) = limit {
            entries.truncate(usize::try_from(limit.max(0)).unwrap_or(usize::MAX));
        }
        Ok(entries
            .into_iter()
            .map(|(id, _, _)| id.to_string())
            .collect())
    }

    async fn prune(&self, now: i64) -> Result<u64, JournalError> {
        let cutoff = now.saturating_sub(self.retention.max_age_ms);
        let mut removed = 0_u64;
        for shard in self.shards.iter() {
            lock(shard).retain(|log| {
                let expired = log.events.last().is_some_and(|last| last.at < cutoff);
                removed += u64::from(expired);
                !expired
            });
        }
        if removed > 0 {
            self.rewrites.send_modify(|rung| *rung += 1);
        }
        Ok(removed)
    }

    fn subscribe(&self) -> JournalSubscription {
        self.committed.subscribe()
    }

    fn commit_doorbell(&self) -> JournalDoorbell {
        self.rewrites.subscribe()
    }
}

/// The length of `value` as compact JSON text, counted without keeping the text.
fn json_text_len(value: &impl serde::Serialize) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing to a counter cannot fail, nor can serializing a JSON object.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn input(engagement_id: &str, at: i64, kind: &str) -> AppendInput {
        let raw = json!({"engagementId": engagement_id, "at": at, "type": kind, "data": {}});
        match AppendInput::from_json(raw) {
            Ok(input) => input,
            Err(error) => panic!("valid input rejected: {error}"),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        match tokio::runtime::Builder::new_current_thread().build() {
            Ok(runtime) => runtime,
            Err(error) => panic!("no runtime: {error}"),
        }
    }

    #[test]
    fn full_is_checked_before_the_expected_seq_and_neither_consumes_a_seq() {
        runtime().block_on(async {
            let retention = RetentionConfig {
                max_events_per_engagement: 2,
                max_age_ms: 1000,
            };
            let journal = InMemoryEngagementJournal::new(retention);
            assert!(journal.append(input("e", 1, "a")).await.is_ok());
            let wrong = journal
                .append(input("e", 2, "b").with_expected_seq(5))
                .await;
            assert!(matches!(
                wrong,
                Err(JournalError::WrongExpectedSeq {
                    expected: 5,
                    actual: 1
                })
            ));
            let right = journal
                .append(input("e", 2, "b").with_expected_seq(1))
                .await;
            assert_eq!(right.map(|event| event.seq).ok(), Some(1));
            let full = journal
                .append(input("e", 3, "c").with_expected_seq(7))
                .await;
            assert!(matches!(
                full,
                Err(JournalError::JournalFull { max_events: 2, .. })
            ));
            assert_eq!(
                journal.read("e").await.map(|events| events.len()).ok(),
                Some(2)
            );
        });
    }

    #[test]
    fn recency_uses_the_last_appended_at_and_recreation_order() {
        runtime().block_on(async {
            let journal = InMemoryEngagementJournal::default();
            for (id, at) in [("a", 10), ("b", 10), ("c", 50), ("c", 5)] {
                assert!(journal.append(input(id, at, "x")).await.is_ok());
            }
            // c's last appended at is 5 although it also holds 50; a and b tie, b is newer.
            let ids = journal.list_engagements(None).await.unwrap_or_default();
            assert_eq!(ids, ["b", "a", "c"]);
            assert_eq!(
                journal
                    .list_engagements(Some(-1))
                    .await
                    .unwrap_or_default()
                    .len(),
                0
            );
            // Pruning `c` (last at 5 < cutoff 10) then re-creating it makes it the newest of
            // the tie at 10.
            assert_eq!(
                journal
                    .prune(10 + RetentionConfig::DEFAULT_MAX_AGE_MS)
                    .await
                    .ok(),
                Some(1)
            );
            assert!(journal.append(input("c", 10, "x")).await.is_ok());
            let ids = journal.list_engagements(Some(2)).await.unwrap_or_default();
            assert_eq!(ids, ["c", "b"]);
        });
    }

    #[test]
    fn subscribers_get_each_committed_event_once_in_seq_order() {
        runtime().block_on(async {
            let retention = RetentionConfig {
                max_events_per_engagement: 3,
                max_age_ms: 1000,
            };
            let journal = InMemoryEngagementJournal::new(retention);
            let mut events = journal.subscribe();
            for at in 0..5 {
                // The last two fail (full) and must not be published.
                let _ = journal.append(input("e", at, "x")).await;
            }
            let _ = journal
                .append_json(json!({"engagementId": "e", "at": 1}))
                .await;
            let mut seen = Vec::new();
            let mut generations = Vec::new();
            while let Ok(committed) = events.try_recv() {
                seen.push(committed.event.seq);
                generations.push(committed.generation);
            }
            assert_eq!(seen, [0, 1, 2]);
            // Each carries the numbering's generation, the one a read reports.
            let tail = journal
                .read_tail("e", 0, TailBound::ALL)
                .await
                .expect("read the tail");
            let generation = tail.generation.expect("the engagement has events");
            assert_eq!(generations, [generation; 3]);
        });
    }

    #[test]
    fn read_from_returns_the_tail() {
        runtime().block_on(async {
            let journal = InMemoryEngagementJournal::default();
            for at in 0..4 {
                assert!(journal.append(input("e", at, "x")).await.is_ok());
            }
            let seqs =
                |events: Vec<EngagementEvent>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
            assert_eq!(
                journal.read_from("e", 2).await.map(seqs).ok(),
                Some(vec![2, 3])
            );
            assert_eq!(
                journal.read_from("e", -3).await.map(seqs).ok(),
                Some(vec![0, 1, 2, 3])
            );
            assert_eq!(journal.read_from("e", 9).await.map(seqs).ok(), Some(vec![]));
            assert_eq!(journal.summarize("nobody").await.ok(), Some(None));
        });
    }

    #[test]
    fn concurrent_appends_to_one_engagement_get_distinct_gapless_seqs() {
        let journal = Arc::new(InMemoryEngagementJournal::default());
        let threads: Vec<_> = (0..4)
            .map(|thread| {
                let journal = Arc::clone(&journal);
                std::thread::spawn(move || {
                    runtime().block_on(async {
                        for i in 0..250 {
                            let raw: Value = json!({"engagementId": "shared", "at": i,
                                                    "type": "x", "data": {"thread": thread}});
                            assert!(journal.append_json(raw).await.is_ok());
                        }
                    });
                })
            })
            .collect();
        for thread in threads {
            assert!(thread.join().is_ok());
        }
        let events = runtime()
            .block_on(journal.read("shared"))
            .unwrap_or_default();
        assert_eq!(events.len(), 1000);
        assert!(events
            .iter()
            .enumerate()
            .all(|(i, event)| event.seq == i as i64));
    }

    /// The shard `engagement_id` lives in: the one found locked while its guard is held.
    fn shard_index(journal: &InMemoryEngagementJournal, engagement_id: &str) -> usize {
        let (_, _held) = journal.shard(engagement_id);
        let locked: Vec<usize> = (0..SHARD_COUNT)
            .filter(|&index| journal.shards[index].try_lock().is_err())
            .collect();
        assert_eq!(locked.len(), 1, "one shard is locked: {locked:?}");
        locked[0]
    }

    /// Issue 3's "different engagements do not wait for each other", as this journal keeps it:
    /// an append holds its engagement's shard lock for as long as it runs (check, push, publish),
    /// so holding that lock here is exactly an append to `busy` in progress; two more appends to
    /// `busy`, on their own threads, queue behind it. An append to an engagement of another
    /// shard completes meanwhile, and only then is `busy` released: its appends cannot have
    /// completed before (the test asserts it), and they complete after, at seqs 0 and 1.
    ///
    /// Causality, not timing: the other engagement's append is proven not to wait because it
    /// finishes while the lock it would wait for is still held (a 30 s bound only keeps a broken
    /// journal from hanging the test). What is not promised: engagements that hash to the same
    /// shard (one pair in 64) share its lock, so one of them waits while the other's operation
    /// runs (an append, or a summary or compaction of a long log).
    #[test]
    fn an_append_to_another_engagement_completes_while_one_engagement_is_held() {
        use std::sync::mpsc;
        use std::time::Duration;

        const BOUND: Duration = Duration::from_secs(30);
        let journal = Arc::new(InMemoryEngagementJournal::default());
        let busy = "busy";
        let busy_shard = shard_index(&journal, busy);
        let other = (0..)
            .map(|n| format!("other-{n}"))
            .find(|id| shard_index(&journal, id) != busy_shard)
            .expect("some id lives in another shard");

        let (_, held) = journal.shard(busy);
        let (done, finished) = mpsc::channel::<(String, Result<EngagementEvent, JournalError>)>();
        let append_on_a_thread = |engagement_id: String| {
            let journal = Arc::clone(&journal);
            let done = done.clone();
            std::thread::spawn(move || {
                let result = runtime().block_on(journal.append(input(&engagement_id, 1, "x")));
                let _ = done.send((engagement_id, result));
            })
        };
        let mut threads = vec![
            append_on_a_thread(busy.to_owned()),
            append_on_a_thread(busy.to_owned()),
        ];
        threads.push(append_on_a_thread(other.clone()));

        let (first, result) = match finished.recv_timeout(BOUND) {
            Ok(message) => message,
            Err(error) => panic!("the append to {other} waited for {busy}'s lock: {error}"),
        };
        assert_eq!(
            first, other,
            "only {other}'s append can finish while {busy} is held"
        );
        assert_eq!(result.map(|event| event.seq).ok(), Some(0));
        assert!(
            matches!(finished.try_recv(), Err(mpsc::TryRecvError::Empty)),
            "an append to {busy} finished while its lock was held"
        );

        drop(held);
        let mut busy_seqs = Vec::new();
        for _ in 0..2 {
            match finished.recv_timeout(BOUND) {
                Ok((engagement_id, result)) => {
                    assert_eq!(engagement_id, busy);
                    busy_seqs.push(result.map(|event| event.seq).ok());
                }
                Err(error) => panic!("{busy}'s appends did not finish once released: {error}"),
            }
        }
        busy_seqs.sort_unstable();
        assert_eq!(busy_seqs, [Some(0), Some(1)]);
        for thread in threads {
            assert!(thread.join().is_ok());
        }
    }

    /// A listing locks one shard at a time: it used to hold every shard through its collection
    /// and sort, so appends to every engagement waited for it (a listing of a million
    /// engagements held them 200 ms). Here the last shard is held (an append in progress
    /// there), so a listing started meanwhile waits at it; an append to an engagement of the
    /// first shard, which the listing has read by then, completes while the listing still
    /// waits. (The short sleep lets the listing reach the held shard; were it slower, the test
    /// would pass without proving much, never fail.)
    #[test]
    fn a_listing_waiting_for_one_shard_holds_up_no_other() {
        use std::sync::mpsc;
        use std::time::Duration;

        const BOUND: Duration = Duration::from_secs(30);
        let journal = Arc::new(InMemoryEngagementJournal::default());
        let in_shard = |wanted: usize| {
            (0..)
                .map(|n| format!("e-{n}"))
                .find(|id| shard_index(&journal, id) == wanted)
                .expect("some id lives in every shard")
        };
        let (first, last) = (in_shard(0), in_shard(SHARD_COUNT - 1));
        runtime()
            .block_on(journal.append(input(&last, 1, "x")))
            .expect("append");
        let held = lock(&journal.shards[SHARD_COUNT - 1]);
        let (listed, listing) = mpsc::channel();
        let lister = {
            let journal = Arc::clone(&journal);
            std::thread::spawn(move || {
                let _ = listed.send(runtime().block_on(journal.list_engagements(None)));
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        let (appended, append) = mpsc::channel();
        let appender = {
            let journal = Arc::clone(&journal);
            let first = first.clone();
            std::thread::spawn(move || {
                let _ = appended.send(runtime().block_on(journal.append(input(&first, 2, "x"))));
            })
        };
        let event = append
            .recv_timeout(BOUND)
            .expect("the append to the first shard waited for the listing")
            .expect("append");
        assert_eq!(event.seq, 0);
        assert!(
            matches!(listing.try_recv(), Err(mpsc::TryRecvError::Empty)),
            "the listing finished while a shard it needs was held"
        );
        drop(held);
        let ids = listing
            .recv_timeout(BOUND)
            .expect("the listing finishes")
            .expect("list");
        assert!(ids.contains(&last), "{ids:?}");
        assert!(lister.join().is_ok() && appender.join().is_ok());
    }
}
