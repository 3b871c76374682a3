//! One look at the change log after each commit, for every run stream at once.
//!
//! Why it exists: a run stream (`GET /v1/activity/runs/{runId}/stream`) whose run is quiet used
//! to wake at every ring of the change doorbell, that is after every commit to the database,
//! and ask the store two questions (its run's newest change id and the log's horizon) to learn
//! that it had nothing to send. Looking at most every 10 ms, 200 such streams still took 3.7
//! CPU-seconds in 8 s beside a writer at 1,000 writes/s (stop 53). Here one task answers the
//! doorbell for all of them: after a ring (at most every [`LOOK_PAUSE`]) it asks the store once
//! which runs logged a change since its last look, with the horizon and the prune count
//! ([`ActivityStore::log_movement`]), and wakes only the streams of those runs; every stream
//! when the horizon or the prune count moved (a prune or a trim may have deleted a followed
//! run's changes, or its detail, which no change says), when the look failed, or when the
//! range was too long to look at ([`LONGEST_LOOK`]). A woken stream takes the same step as
//! before (its probes, then a page when its run moved), so what a stream sends is decided as
//! before; only when it looks changed.
//!
//! A stream that is not woken does not look, so its cursor would stay where it last looked, and
//! the page it reads when its run moves would hold every other run's changes since (seconds of
//! them; a stream resumed with `Last-Event-ID` would even take a prune of another run as a gap:
//! an audit's findings). So each route keeps its run's **clean streak**: the ids the task looked
//! through without finding a change of the run, with neither the horizon nor the prune count
//! moving, since it last did (and the streak before, for a stream that looks only after the
//! next one began). A stream moves its cursor over a streak that begins at or below it before it
//! looks: no change of its run was ever in it.
//!
//! No change of a followed run goes unseen: a stream's route exists before its first look at
//! the store, and change ids are a watermark (nothing at or below a seen id commits later), so
//! a change the stream's last look did not see has an id above the doorbell's value at that
//! look, and the task's looks cover every id above its start without a hole, each after the
//! doorbell rang for it. The routes are found after the store was read, so a route made during
//! a look misses nothing that look read (its stream's first look sees it). A change deleted
//! before the task read it moved the horizon or the prune count.

use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use flightlog_core::activity::{ActivityStore, ChangeDoorbell};
use tokio::sync::watch;

use crate::followed::Followed;

/// The shortest time between two looks: the commits in between share one.
pub(crate) const LOOK_PAUSE: Duration = Duration::from_millis(10);

/// The most change ids one look reads the runs of; a longer range (a bulk import between two
/// looks) wakes every stream instead, which each answer with their two probes.
pub(crate) const LONGEST_LOOK: i64 = 100_000;

/// The routes of one server's run streams (see the module docs).
#[derive(Default)]
pub(crate) struct RunHub {
    shared: Arc<HubShared>,
    /// Set once the task runs (with the doorbell value it starts from).
    started: OnceLock<()>,
}

#[derive(Default)]
struct HubShared {
    routes: Mutex<Routes>,
    /// Looks at the store so far (tests wait for the first, which wakes every stream).
    looks: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Routes {
    by_run: Followed<Route>,
    /// The change id the task has looked through (its next look begins after it).
    looked_to: i64,
}

/// Change ids `(from, to]` the task looked through without finding a change of a run, with the
/// horizon and the prune count unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Streak {
    from: i64,
    to: i64,
}

impl Streak {
    fn empty_at(id: i64) -> Self {
        Streak { from: id, to: id }
    }

    /// `cursor` moved over the streak, when the streak begins at or below it.
    fn skip(self, cursor: i64) -> i64 {
        if self.from <= cursor && cursor < self.to {
            self.to
        } else {
            cursor
        }
    }
}

struct Route {
    /// Bumped to wake the run's streams.
    wake: watch::Sender<u64>,
    /// The streak the task is in (see the module docs).
    streak: Streak,
    /// The streak before it.
    last_streak: Streak,
}

/// A run stream's place on its run's route; dropping it frees the route after its last
/// follower.
pub(crate) struct RunSubscription {
    shared: Arc<HubShared>,
    run_id: Arc<str>,
    wake: watch::Receiver<u64>,
}

impl RunHub {
    /// A subscription to wake-ups for `run_id`, made before the stream first looks at the store.
    pub(crate) fn subscribe(
        &self,
        store: &Arc<dyn ActivityStore>,
        run_id: &str,
    ) -> RunSubscription {
        self.started.get_or_init(|| {
            let mut doorbell = store.change_doorbell();
            // Where its looks begin: read here, not when the task first runs, so a commit
            // between the two is in its first range rather than taken as already seen.
            let start = *doorbell.borrow_and_update();
            self.shared.routes().looked_to = start;
            // Weak: the task must not keep the store alive.
            tokio::spawn(watch_the_log(
                Arc::clone(&self.shared),
                doorbell,
                start,
                Arc::downgrade(store),
            ));
        });
        let mut routes = self.shared.routes();
        let looked_to = routes.looked_to;
        let (run_id, route) = routes.by_run.follow(run_id, || Route {
            wake: watch::channel(0).0,
            streak: Streak::empty_at(looked_to),
            last_streak: Streak::empty_at(looked_to),
        });
        let wake = route.wake.subscribe();
        drop(routes);
        RunSubscription {
            shared: Arc::clone(&self.shared),
            run_id,
            wake,
        }
    }

    /// How many times the task looked at the store.
    #[cfg(test)]
    pub(crate) fn looks(&self) -> u64 {
        self.shared.looks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many runs have a route (tests see routes freed).
    #[cfg(test)]
    pub(crate) fn routes(&self) -> usize {
        self.shared.routes().by_run.len()
    }
}

impl HubShared {
    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a look through `(looked_to, up_to]` found: `moved` the runs with a change in it, or
    /// `None` for "any may have moved" (the horizon or the prune count moved, or the look
    /// failed or was not made). The runs that may have moved are woken. A run with no change in
    /// the range has its streak grow to `up_to`; one that had, or may have had (`None` over a
    /// range holding ids: a change of it there may have been deleted before the look read it),
    /// begins a new streak after `up_to`. A prune rings without moving the doorbell: its look's
    /// range holds no id, so it wakes every stream and breaks no streak.
    fn looked(&self, up_to: i64, moved: Option<&[String]>) {
        let mut routes = self.routes();
        let range_holds_ids = up_to > routes.looked_to;
        routes.looked_to = routes.looked_to.max(up_to);
        let moved: Option<std::collections::HashSet<&str>> =
            moved.map(|runs| runs.iter().map(String::as_str).collect());
        for (run_id, route) in routes.by_run.iter_mut() {
            let (clean, wake) = match &moved {
                Some(moved) => {
                    let moved = moved.contains(&**run_id);
                    (!moved, moved)
                }
                None => (!range_holds_ids, true),
            };
            if clean {
                route.streak.to = route.streak.to.max(up_to);
            } else {
                route.last_streak = route.streak;
                route.streak = Streak::empty_at(up_to);
            }
            if wake {
                route.wake.send_modify(|count| *count += 1);
            }
        }
    }
}

/// The task: after each ring, at most every [`LOOK_PAUSE`], one look at what moved since the
/// last one, and the streams it concerns woken. It ends with the store or its doorbell.
async fn watch_the_log(
    shared: Arc<HubShared>,
    mut doorbell: ChangeDoorbell,
    start: i64,
    store: Weak<dyn ActivityStore>,
) {
    let mut cursor = start;
    // The horizon and prune count at the last look; `None` until the first (which wakes all).
    let mut known: Option<(i64, i64)> = None;
    let mut looked_at: Option<tokio::time::Instant> = None;
    loop {
        if doorbell.changed().await.is_err() {
            return;
        }
        if let Some(looked) = looked_at {
            tokio::time::sleep_until(looked + LOOK_PAUSE).await;
        }
        looked_at = Some(tokio::time::Instant::now());
        // Noted before the store is read: a commit during the look rings again.
        let rung = (*doorbell.borrow_and_update()).max(cursor);
        let idle = {
            let mut routes = shared.routes();
            if routes.by_run.is_empty() {
                routes.looked_to = rung;
                true
            } else {
                false
            }
        };
        if idle {
            cursor = rung;
            continue;
        }
        let Some(store) = store.upgrade() else {
            return;
        };
        if rung - cursor > LONGEST_LOOK {
            known = None;
            shared.looked(rung, None);
        } else {
            match store.log_movement(cursor, rung).await {
                Ok(movement) => {
                    let now = (movement.horizon, movement.prunes);
                    if known.replace(now) == Some(now) {
                        shared.looked(rung, Some(&movement.runs));
                    } else {
                        shared.looked(rung, None);
                    }
                }
                Err(_) => {
                    // Each stream meets the failure in its own look.
                    known = None;
                    shared.looked(rung, None);
                }
            }
        }
        shared
            .looks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        cursor = rung;
    }
}

impl RunSubscription {
    /// Waits until the run may have moved (see the module docs).
    pub(crate) async fn woken(&mut self) {
        if self.wake.changed().await.is_err() {
            // The route is gone with the hub: nothing will wake it.
            std::future::pending::<()>().await;
        }
    }

    /// `cursor` moved over the run's clean streaks that begin at or below it (see the module
    /// docs): no change of the run was ever at an id it passes.
    pub(crate) fn skip_clean(&self, cursor: i64) -> i64 {
        let routes = self.shared.routes();
        match routes.by_run.get(&self.run_id) {
            Some(route) => route.streak.skip(route.last_streak.skip(cursor)),
            None => cursor,
        }
    }
}

impl Drop for RunSubscription {
    fn drop(&mut self) {
        self.shared.routes().by_run.leave(&self.run_id);
    }
}
