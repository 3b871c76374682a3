//! The journal's committed events, routed to the live streams of their own engagement.
//!
//! Why it exists: each engagement stream used to hold a receiver of the journal's subscription,
//! which carries every engagement's appends, so every append woke every open engagement stream
//! to compare one id; and each held the journal's commit doorbell, which rang after any commit
//! to the file (this process's own too: its watcher could not tell them apart) at most every
//! 40 ms, so every stream read its engagement 25 times a second while anything was written.
//! (The doorbell now rings only for journal commits the subscription did not carry: see
//! `flightlog_sqlite`'s `journal_bells`.)
//! 1,000 streams on 1,000 engagements at 1,000 appends a second took a core of the server's two
//! for nothing (1,054 µs of server CPU an append against 202 with no stream; measured in stop
//! 54). Here one task takes the journal's subscription and hands each event to the streams of
//! its engagement only, through a channel per engagement that exists while a stream follows it;
//! and it alone answers the doorbell: it asks the journal where every followed engagement
//! stands ([`EngagementJournal::heads`], one index lookup each) and tells only the streams of
//! an engagement that moved other than by the events routed to them (another process's
//! append, a compaction, a prune) to read the store.
//!
//! It keeps what a stream's own receiver gave:
//! - **Nothing committed after a stream subscribed is missed**: the task's receiver is made
//!   before the first stream's route (under a `OnceLock`, so a second stream does not read before
//!   it exists), and a route is made before the stream's first read of the store. An event
//!   committed after that read reaches the task after the route exists, so it is routed to the
//!   stream; one committed before is in the read, and the stream skips it by its seq.
//! - **A miss is said, never silent**: when the task falls behind the journal's channel (its
//!   `Lagged`), every stream is told that events may be missing ([`Delivery::Missed`]) and reads
//!   the store; a stream behind its engagement's channel gets the same. The journal closing ends
//!   every route ([`Delivery::Closed`]).
//! - **Another process's commits reach the streams, within the doorbell's 250 ms**: a route
//!   knows where its engagement stood after the last event routed or head read (unknown when
//!   new); after each ring every route's head is read again, and a route whose head differs
//!   (or was unknown) tells its streams to read. A commit after the heads were read moved the
//!   file after the watcher's last look, so it rings again. A head read that fails tells every
//!   stream to read (each then meets the error itself).
//! - **Bounded memory**: a route's channel holds [`ROUTE_CAPACITY`] events, allocated when its
//!   first stream subscribes and freed when its last one ends.

use crate::followed::Followed;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use flightlog_core::journal::{
    CommittedEvent, EngagementHead, EngagementJournal, JournalDoorbell, JournalSubscription,
};
use tokio::sync::{broadcast, watch};

/// Events an engagement's channel holds for a stream that is slow to take them; past that the
/// stream reads the store (its page read is no slower than taking the events one by one).
pub(crate) const ROUTE_CAPACITY: usize = 256;

/// The routes of one server's journal (see the module docs).
#[derive(Default)]
pub(crate) struct JournalHub {
    shared: Arc<HubShared>,
    /// Set once the routing task runs (with the journal's receiver it made first).
    started: OnceLock<()>,
    /// Tests: the task never hears the doorbell (only routed events reach the streams).
    #[cfg(test)]
    deaf: bool,
}

#[derive(Default)]
struct HubShared {
    routes: Mutex<Followed<Route>>,
    /// Counts the times the routing task fell behind the journal's channel.
    missed: watch::Sender<u64>,
    /// Looks at the heads so far (tests see that the hub's own appends need none).
    #[cfg(test)]
    head_looks: std::sync::atomic::AtomicU64,
}

struct Route {
    events: broadcast::Sender<Routed>,
    /// Where its engagement stood after the last event routed or head read; `None` while
    /// unknown (a new route, or after the task fell behind).
    head: Option<Option<EngagementHead>>,
}

/// What a route carries.
#[derive(Debug, Clone)]
enum Routed {
    Event(CommittedEvent),
    /// The engagement moved other than by the events routed: read the store.
    Look,
}

/// What a subscription's next delivery is.
#[derive(Debug)]
pub(crate) enum Delivery {
    /// An event of the engagement, as committed.
    Event(CommittedEvent),
    /// Events of the engagement may have gone by unseen (a lag, another process's commit, a
    /// compaction or a prune): read the store.
    Missed,
    /// The journal is gone: no more events will be routed.
    Closed,
}

/// A stream's place on its engagement's route; leaving it (drop) frees the route after its last
/// follower.
pub(crate) struct EngagementSubscription {
    shared: Arc<HubShared>,
    engagement_id: Arc<str>,
    events: broadcast::Receiver<Routed>,
    missed: watch::Receiver<u64>,
}

impl JournalHub {
    /// A subscription to `engagement_id`'s events committed from now on. Made before the
    /// stream's first read of the store (see the module docs).
    pub(crate) fn subscribe(
        &self,
        journal: &Arc<dyn EngagementJournal>,
        engagement_id: &str,
    ) -> EngagementSubscription {
        self.started.get_or_init(|| {
            let receiver = journal.subscribe();
            #[cfg(test)]
            let doorbell = if self.deaf {
                watch::channel(0).1
            } else {
                journal.commit_doorbell()
            };
            #[cfg(not(test))]
            let doorbell = journal.commit_doorbell();
            // Weak: the task must not keep the journal (and its channel, which ends the task)
            // alive.
            tokio::spawn(route_events(
                Arc::clone(&self.shared),
                receiver,
                doorbell,
                Arc::downgrade(journal),
            ));
        });
        let mut routes = self.shared.routes();
        let (engagement_id, route) = routes.follow(engagement_id, || Route {
            events: broadcast::channel(ROUTE_CAPACITY).0,
            head: None,
        });
        let events = route.events.subscribe();
        drop(routes);
        EngagementSubscription {
            missed: self.shared.missed.subscribe(),
            shared: Arc::clone(&self.shared),
            engagement_id,
            events,
        }
    }

    /// A hub whose task never hears the doorbell (tests of what routed events alone do).
    #[cfg(test)]
    pub(crate) fn deaf_to_the_doorbell() -> Self {
        JournalHub {
            deaf: true,
            ..JournalHub::default()
        }
    }

    /// How many times the task read the followed engagements' heads.
    #[cfg(test)]
    pub(crate) fn head_looks(&self) -> u64 {
        self.shared
            .head_looks
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many engagements have a route (tests see routes freed).
    #[cfg(test)]
    pub(crate) fn routes(&self) -> usize {
        self.shared.routes().len()
    }
}

/// The routing task: each committed event to its engagement's route, if any; a lag to everyone;
/// after each ring of the doorbell, a look at every route's head.
async fn route_events(
    shared: Arc<HubShared>,
    mut committed: JournalSubscription,
    mut doorbell: JournalDoorbell,
    journal: std::sync::Weak<dyn EngagementJournal>,
) {
    use broadcast::error::RecvError;
    let mut doorbell_open = true;
    loop {
        let rung = async {
            if doorbell_open {
                doorbell.changed().await.is_ok()
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            // Events first: a ring is answered after the events committed before it are routed,
            // so their routes' heads are known and need no look.
            biased;
            received = committed.recv() => match received {
                Ok(event) => shared.route(event),
                Err(RecvError::Lagged(_)) => {
                    shared.forget_heads();
                    shared.missed.send_modify(|missed| *missed += 1);
                }
                Err(RecvError::Closed) => {
                    // Dropping the senders closes every follower's channel.
                    shared.routes().clear();
                    return;
                }
            },
            open = rung => {
                if !open {
                    doorbell_open = false;
                    continue;
                }
                let Some(journal) = journal.upgrade() else {
                    return;
                };
                shared.look_at_heads(journal.as_ref()).await;
            }
        }
    }
}

impl HubShared {
    fn routes(&self) -> std::sync::MutexGuard<'_, Followed<Route>> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn route(&self, committed: CommittedEvent) {
        let mut routes = self.routes();
        if let Some(route) = routes.get_mut(&committed.event.engagement_id) {
            let next_seq = committed.event.seq + 1;
            let generation = committed.generation;
            route.head = Some(Some(match route.head {
                // The store's head read earlier may be ahead of the events routed since.
                Some(Some(head)) if head.generation == generation => EngagementHead {
                    generation,
                    next_seq: head.next_seq.max(next_seq),
                },
                _ => EngagementHead {
                    generation,
                    next_seq,
                },
            }));
            // An error only means its followers all left since.
            let _ = route.events.send(Routed::Event(committed));
        }
    }

    fn forget_heads(&self) {
        for route in self.routes().routes_mut() {
            route.head = None;
        }
    }

    /// Read every route's head; tell the routes whose head is not what they knew.
    async fn look_at_heads(&self, journal: &dyn EngagementJournal) {
        let ids: Vec<Arc<str>> = self.routes().ids().cloned().collect();
        if ids.is_empty() {
            return;
        }
        #[cfg(test)]
        self.head_looks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let heads = journal.heads(&ids).await;
        let mut routes = self.routes();
        match heads {
            Ok(heads) => {
                for (id, head) in ids.iter().zip(heads) {
                    if let Some(route) = routes.get_mut(id) {
                        if route.head != Some(head) {
                            route.head = Some(head);
                            let _ = route.events.send(Routed::Look);
                        }
                    }
                }
            }
            Err(_) => {
                for route in routes.routes_mut() {
                    route.head = None;
                    let _ = route.events.send(Routed::Look);
                }
            }
        }
    }
}

impl EngagementSubscription {
    /// The next delivery for this engagement (see [`Delivery`]).
    pub(crate) async fn recv(&mut self) -> Delivery {
        use broadcast::error::RecvError;
        tokio::select! {
            received = self.events.recv() => match received {
                Ok(Routed::Event(event)) => Delivery::Event(event),
                Ok(Routed::Look) => Delivery::Missed,
                Err(RecvError::Lagged(_)) => Delivery::Missed,
                Err(RecvError::Closed) => Delivery::Closed,
            },
            changed = self.missed.changed() => match changed {
                Ok(()) => Delivery::Missed,
                // The hub is gone with its task.
                Err(_) => Delivery::Closed,
            },
        }
    }
}

impl Drop for EngagementSubscription {
    fn drop(&mut self) {
        self.shared.routes().leave(&self.engagement_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flightlog_core::journal::InMemoryEngagementJournal;
    use std::time::Duration;

    async fn append(journal: &dyn EngagementJournal, engagement_id: &str, at: i64) {
        journal
            .append_json(serde_json::json!({
                "engagementId": engagement_id, "at": at, "type": "note", "data": {}
            }))
            .await
            .expect("append");
    }

    async fn next(subscription: &mut EngagementSubscription) -> Delivery {
        tokio::time::timeout(Duration::from_secs(5), subscription.recv())
            .await
            .expect("a delivery within 5 s")
    }

    /// The next event, past any `Missed` (a ring can be answered before an event committed
    /// just before it is routed: its route's head is then unknown, and its streams read).
    async fn next_event(subscription: &mut EngagementSubscription) -> i64 {
        loop {
            match next(subscription).await {
                Delivery::Missed => continue,
                delivery => return seq_of(delivery),
            }
        }
    }

    /// Take whatever comes within 100 ms.
    async fn settle(subscription: &mut EngagementSubscription) {
        while tokio::time::timeout(Duration::from_millis(100), subscription.recv())
            .await
            .is_ok()
        {}
    }

    fn seq_of(delivery: Delivery) -> i64 {
        match delivery {
            Delivery::Event(committed) => committed.event.seq,
            other => panic!("an event expected, got {other:?}"),
        }
    }

    /// Each subscription gets its own engagement's events, in order, and no other's; the route
    /// goes when its last follower leaves.
    #[tokio::test]
    async fn each_stream_gets_its_engagement_only() {
        let journal: Arc<dyn EngagementJournal> = Arc::new(InMemoryEngagementJournal::default());
        let hub = JournalHub::default();
        let mut a1 = hub.subscribe(&journal, "a");
        let mut a2 = hub.subscribe(&journal, "a");
        let mut b = hub.subscribe(&journal, "b");
        assert_eq!(hub.routes(), 2);
        for at in 0..3 {
            append(journal.as_ref(), "a", at).await;
            append(journal.as_ref(), "c", at).await;
            append(journal.as_ref(), "b", at).await;
        }
        for subscription in [&mut a1, &mut a2, &mut b] {
            let seqs = [
                seq_of(next(subscription).await),
                seq_of(next(subscription).await),
                seq_of(next(subscription).await),
            ];
            assert_eq!(seqs, [0, 1, 2]);
            assert!(
                tokio::time::timeout(Duration::from_millis(50), subscription.recv())
                    .await
                    .is_err(),
                "nothing else"
            );
        }
        drop(a1);
        assert_eq!(hub.routes(), 2);
        drop(a2);
        drop(b);
        assert_eq!(hub.routes(), 0);
    }

    /// A stream more than a route's capacity behind is told it missed events, not left to
    /// take a later event as its next.
    #[tokio::test]
    async fn a_stream_behind_its_route_is_told_it_missed_events() {
        let journal: Arc<dyn EngagementJournal> = Arc::new(InMemoryEngagementJournal::default());
        let hub = JournalHub::default();
        let mut slow = hub.subscribe(&journal, "a");
        for at in 0..(ROUTE_CAPACITY as i64 + 10) {
            append(journal.as_ref(), "a", at).await;
            // Let the routing task keep up with the journal's own channel.
            tokio::task::yield_now().await;
        }
        assert!(matches!(next(&mut slow).await, Delivery::Missed));
    }

    /// When the routing task falls behind the journal's channel, every stream is told.
    #[tokio::test]
    async fn a_lag_of_the_routing_task_reaches_every_stream() {
        let journal: Arc<dyn EngagementJournal> =
            Arc::new(InMemoryEngagementJournal::with_subscriber_buffer(
                flightlog_core::journal::RetentionConfig::default(),
                4,
            ));
        let hub = JournalHub::default();
        let mut quiet = hub.subscribe(&journal, "quiet");
        // On this single-threaded runtime the routing task runs only when the test waits, so
        // twenty appends overrun the journal's channel of four first.
        for at in 0..20 {
            append(journal.as_ref(), "busy", at).await;
        }
        assert!(matches!(next(&mut quiet).await, Delivery::Missed));
    }

    /// The journal gone, every stream hears it closed.
    #[tokio::test]
    async fn a_closed_journal_closes_every_route() {
        let journal: Arc<dyn EngagementJournal> = Arc::new(InMemoryEngagementJournal::default());
        let hub = JournalHub::default();
        let mut follower = hub.subscribe(&journal, "a");
        drop(journal);
        assert!(matches!(next(&mut follower).await, Delivery::Closed));
        drop(follower);
        assert_eq!(hub.routes(), 0);
    }

    /// Two handles on one SQLite file, as two server instances would be: the second one's
    /// appends are not on the first one's subscription, only its doorbell.
    fn two_handles(
        dir: &std::path::Path,
    ) -> (Arc<dyn EngagementJournal>, Arc<dyn EngagementJournal>) {
        let db = flightlog_sqlite::SqliteDatabase::open(flightlog_sqlite::SqliteConfig::new(
            dir.join("hub.db"),
        ))
        .expect("open");
        let first =
            flightlog_sqlite::SqliteEngagementJournal::new(Arc::clone(&db), Default::default());
        let second = flightlog_sqlite::SqliteEngagementJournal::new(db, Default::default());
        (Arc::new(first), Arc::new(second))
    }

    /// The doorbell rings after another handle's appends (which the hub's subscription does not
    /// carry), but a stream whose engagement did not move is not told: appends to another
    /// engagement for half a second wake it for nothing.
    #[tokio::test]
    async fn commits_to_other_engagements_do_not_wake_a_stream() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (journal, other) = two_handles(dir.path());
        let hub = JournalHub::default();
        let mut follower = hub.subscribe(&journal, "a");
        append(journal.as_ref(), "a", 0).await;
        assert_eq!(next_event(&mut follower).await, 0);
        settle(&mut follower).await;
        // At least half a second and 30 appends (a busy machine makes each slower): the
        // watcher looks every 40 ms, so a dozen rings or more go by.
        let started = tokio::time::Instant::now();
        let mut at = 0;
        while at < 30 || started.elapsed() < Duration::from_millis(500) {
            append(other.as_ref(), "b", at).await;
            at += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let woken = tokio::time::timeout(Duration::from_millis(200), follower.recv()).await;
        assert!(woken.is_err(), "woken for nothing: {woken:?}");
    }

    /// The hub's own journal handle's appends, which its subscription routes, ring no doorbell,
    /// so the hub reads no head for them (it read every followed head up to 25 times a second
    /// while they came); another handle's append makes it look.
    #[tokio::test]
    async fn the_hubs_own_appends_need_no_look_at_the_heads() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (journal, other) = two_handles(dir.path());
        let hub = JournalHub::default();
        let mut follower = hub.subscribe(&journal, "a");
        // The watcher's first look learns the count and rings for it (unless it came before the
        // hub heard the doorbell): wait for the hub's look at it, not a fixed time a busy
        // machine may overrun.
        let first_look = tokio::time::Instant::now();
        while hub.head_looks() == 0 && first_look.elapsed() < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let looks_before = hub.head_looks();
        for at in 0..10 {
            append(journal.as_ref(), "a", at).await;
            append(journal.as_ref(), "b", at).await;
            assert_eq!(next_event(&mut follower).await, at);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        // A look may come for nothing when the watcher looks between a commit and its note (a
        // writer thread preempted there, under load); with the doorbell ringing for every
        // journal group there were 10.
        let looks = hub.head_looks() - looks_before;
        assert!(
            looks <= 3,
            "{looks} looks at the heads for the hub's own appends"
        );

        append(other.as_ref(), "a", 10).await;
        assert!(
            matches!(next(&mut follower).await, Delivery::Missed),
            "another handle's append is read from the store"
        );
        assert!(hub.head_looks() > looks_before + looks);
    }

    /// An append through another handle (another instance) is on no subscription here; the
    /// doorbell's look at the heads tells the stream of its engagement to read, and only it.
    #[tokio::test]
    async fn another_handles_append_tells_only_its_engagements_streams() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (journal, other) = two_handles(dir.path());
        let hub = JournalHub::default();
        let mut on_a = hub.subscribe(&journal, "a");
        let mut on_b = hub.subscribe(&journal, "b");
        append(journal.as_ref(), "a", 0).await;
        append(journal.as_ref(), "b", 0).await;
        assert_eq!(next_event(&mut on_a).await, 0);
        assert_eq!(next_event(&mut on_b).await, 0);
        settle(&mut on_a).await;
        settle(&mut on_b).await;
        append(other.as_ref(), "a", 1).await;
        assert!(matches!(next(&mut on_a).await, Delivery::Missed));
        let woken = tokio::time::timeout(Duration::from_millis(300), on_b.recv()).await;
        assert!(woken.is_err(), "b did not move: {woken:?}");
    }
}
