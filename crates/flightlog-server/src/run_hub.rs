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
//! No change of a followed run goes unseen: a stream's route exists before its first look at
//! the store, and change ids are a watermark (nothing at or below a seen id commits later), so
//! a change the stream's last look did not see has an id above the doorbell's value at that
//! look, and the task's looks cover every id above its start without a hole, each after the
//! doorbell rang for it. The routes are found after the store was read, so a route made during
//! a look misses nothing that look read (its stream's first look sees it). A change deleted
//! before the task read it moved the horizon or the prune count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use flightlog_core::activity::{ActivityStore, ChangeDoorbell};
use tokio::sync::watch;

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
    routes: Mutex<HashMap<Arc<str>, Route>>,
    /// Looks at the store so far (tests wait for the first, which wakes every stream).
    looks: std::sync::atomic::AtomicU64,
}

struct Route {
    /// Bumped to wake the run's streams.
    wake: watch::Sender<u64>,
    /// The subscriptions holding it.
    followers: usize,
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
            // Weak: the task must not keep the store alive.
            tokio::spawn(watch_the_log(
                Arc::clone(&self.shared),
                doorbell,
                start,
                Arc::downgrade(store),
            ));
        });
        let mut routes = self.shared.routes();
        let (run_id, wake) = match routes.get_key_value(run_id) {
            Some((id, route)) => (Arc::clone(id), route.wake.subscribe()),
            None => {
                let id: Arc<str> = run_id.into();
                let (sender, receiver) = watch::channel(0);
                routes.insert(
                    Arc::clone(&id),
                    Route {
                        wake: sender,
                        followers: 0,
                    },
                );
                (id, receiver)
            }
        };
        if let Some(route) = routes.get_mut(&run_id) {
            route.followers += 1;
        }
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
        self.shared.routes().len()
    }
}

impl HubShared {
    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Route>> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake_all(&self) {
        for route in self.routes().values() {
            route.wake.send_modify(|count| *count += 1);
        }
    }

    fn wake(&self, runs: &[String]) {
        let routes = self.routes();
        for run in runs {
            if let Some(route) = routes.get(run.as_str()) {
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
        if shared.routes().is_empty() {
            cursor = rung;
            continue;
        }
        let Some(store) = store.upgrade() else {
            return;
        };
        if rung - cursor > LONGEST_LOOK {
            known = None;
            cursor = rung;
            shared.wake_all();
            continue;
        }
        match store.log_movement(cursor, rung).await {
            Ok(movement) => {
                let now = (movement.horizon, movement.prunes);
                if known.replace(now) == Some(now) {
                    shared.wake(&movement.runs);
                } else {
                    shared.wake_all();
                }
            }
            Err(_) => {
                // Each stream meets the failure in its own look.
                known = None;
                shared.wake_all();
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
}

impl Drop for RunSubscription {
    fn drop(&mut self) {
        let mut routes = self.shared.routes();
        if let Some(route) = routes.get_mut(&self.run_id) {
            route.followers = route.followers.saturating_sub(1);
            if route.followers == 0 {
                routes.remove(&self.run_id);
            }
        }
    }
}
