//! The journal's commit doorbells: one for each journal handle (`SqliteEngagementJournal`), rung
//! by the commit watcher for the journal commits that handle's subscription did not carry.
//!
//! Why it exists: a live reader follows a handle's subscription for the appends made through it
//! and its doorbell for everything else (other processes' and other handles' appends, every
//! compaction and prune), and answers a ring with a look at the store (the server's journal hub
//! reads the head of every engagement it follows). The watcher sees that the file changed, not
//! who changed it, so the doorbell rang for this handle's own appends too: with streams on 1,000
//! engagements, at most 25 looks a second of 1,000 heads each while appends came through the
//! server, for events the streams already had.
//!
//! How it knows: every group that writes to the journal moves `flightlog_meta.journal_writes`
//! by one in its transaction (the writer's [`JournalWrites`] of the group). A group whose
//! journal writes were all appends through one handle (its *carrier*) is noted with the value
//! it committed ([`JournalBells::carried`], after its commit). When the watcher sees the count
//! move from `a` to `b`, the groups `a+1 ..= b` are every journal group committed in between;
//! if all were noted as carried by one handle, that handle's doorbell stays quiet and every
//! other rings; else all ring. A group noted only after the watcher looked (the note follows
//! the commit) rings its carrier too, once: a look for nothing, never a commit unseen. Another
//! process's groups are never noted here, so they ring every handle.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

/// Carrier ids: each journal handle takes the next. 0 carries nothing.
static NEXT_CARRIER: AtomicU64 = AtomicU64::new(1);

/// A carrier id for a new journal handle.
pub(crate) fn new_carrier() -> u64 {
    NEXT_CARRIER.fetch_add(1, Ordering::Relaxed)
}

/// The most carried groups kept waiting for the watcher's look: past it the oldest notes go,
/// and their groups ring every doorbell (the watcher looks every 40 ms; a group commits in
/// tens of microseconds at best).
const MOST_NOTES: usize = 1 << 16;

/// What the writer's current group wrote to the journal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum JournalWrites {
    /// Nothing.
    #[default]
    Nothing,
    /// Appends only, all through the handle of this carrier id.
    CarriedBy(u64),
    /// Anything else: appends of several handles, a compaction, a prune.
    Uncarried,
}

impl JournalWrites {
    /// An append through the handle of `carrier`.
    pub(crate) fn append(&mut self, carrier: u64) {
        *self = match *self {
            JournalWrites::Nothing => JournalWrites::CarriedBy(carrier),
            JournalWrites::CarriedBy(same) if same == carrier => JournalWrites::CarriedBy(same),
            _ => JournalWrites::Uncarried,
        };
    }

    /// A write no subscription carries (a compaction, a prune).
    pub(crate) fn rewrite(&mut self) {
        *self = JournalWrites::Uncarried;
    }
}

/// The doorbells of one database's journal handles, and the carried groups not yet looked at.
#[derive(Debug, Default)]
pub(crate) struct JournalBells {
    inner: Mutex<Bells>,
}

#[derive(Debug, Default)]
struct Bells {
    /// carrier id -> its doorbell (shared, so that it is rung after the lock is let go: a
    /// holder of a borrow of its receiver never holds up the watcher with the lock held).
    bells: Vec<(u64, Arc<watch::Sender<u64>>)>,
    /// (`journal_writes` after the group, carrier id) of carried groups, in commit order.
    carried: VecDeque<(i64, u64)>,
}

impl JournalBells {
    fn bells(&self) -> std::sync::MutexGuard<'_, Bells> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A receiver of the doorbell of the handle of `carrier`.
    pub(crate) fn subscribe(&self, carrier: u64) -> watch::Receiver<u64> {
        let mut bells = self.bells();
        if let Some((_, bell)) = bells.bells.iter().find(|(id, _)| *id == carrier) {
            return bell.subscribe();
        }
        let (bell, receiver) = watch::channel(0);
        bells.bells.push((carrier, Arc::new(bell)));
        receiver
    }

    /// The writer committed a group whose journal writes were appends through the handle of
    /// `carrier`, moving `journal_writes` to `count`.
    pub(crate) fn carried(&self, count: i64, carrier: u64) {
        let mut bells = self.bells();
        if bells.carried.len() >= MOST_NOTES {
            bells.carried.pop_front();
        }
        bells.carried.push_back((count, carrier));
    }

    /// The watcher saw `journal_writes` move from `from` (`None`: its first look) to `to`: ring
    /// every doorbell but that of a handle that carried every group in between.
    pub(crate) fn moved(&self, from: Option<i64>, to: i64) {
        let to_ring = {
            let mut bells = self.bells();
            let quiet = match from {
                Some(from) if to > from => sole_carrier(&bells.carried, from, to),
                _ => {
                    // A first look, or a count that went back (the file restored under us):
                    // no note can be trusted to name a group any more.
                    bells.carried.clear();
                    None
                }
            };
            bells.carried.retain(|(count, _)| *count > to);
            bells.bells_to_ring(quiet)
        };
        ring(to_ring);
    }

    /// Ring every doorbell (the watcher could not tell what was written).
    pub(crate) fn ring_all(&self) {
        let to_ring = self.bells().bells_to_ring(None);
        ring(to_ring);
    }
}

impl Bells {
    /// Every doorbell but `quiet`'s, forgetting those nobody holds any more.
    fn bells_to_ring(&mut self, quiet: Option<u64>) -> Vec<Arc<watch::Sender<u64>>> {
        self.bells.retain(|(_, bell)| bell.receiver_count() > 0);
        self.bells
            .iter()
            .filter(|(carrier, _)| Some(*carrier) != quiet)
            .map(|(_, bell)| Arc::clone(bell))
            .collect()
    }
}

/// The one carrier noted for every group of `(from, to]`, if there is one: the notes of that
/// range must be exactly `from + 1 ..= to`, in order (they are noted in commit order), all of
/// one carrier.
fn sole_carrier(carried: &VecDeque<(i64, u64)>, from: i64, to: i64) -> Option<u64> {
    let mut sole = None;
    let mut next = from + 1;
    for &(count, carrier) in carried {
        if count <= from || count > to {
            continue;
        }
        if count != next || sole.is_some_and(|sole| sole != carrier) {
            return None;
        }
        sole = Some(carrier);
        next += 1;
    }
    sole.filter(|_| next == to + 1)
}

/// Ring `bells`.
fn ring(bells: Vec<Arc<watch::Sender<u64>>>) {
    for bell in bells {
        bell.send_modify(|rings| *rings += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_that_carried_every_group_in_between_is_not_rung() {
        let bells = JournalBells::default();
        let mut first = bells.subscribe(1);
        let mut second = bells.subscribe(2);
        let rung = |bell: &mut watch::Receiver<u64>| {
            let changed = bell.has_changed().expect("open");
            bell.borrow_and_update();
            changed
        };
        // The first look rings everyone.
        bells.moved(None, 0);
        assert!(rung(&mut first) && rung(&mut second));

        bells.carried(1, 1);
        bells.carried(2, 1);
        bells.moved(Some(0), 2);
        assert!(!rung(&mut first), "its own appends");
        assert!(rung(&mut second));

        // A group noted for no one (another process's) in the range rings everyone.
        bells.carried(4, 1);
        bells.moved(Some(2), 4);
        assert!(rung(&mut first) && rung(&mut second));

        // Groups of two carriers ring both.
        bells.carried(5, 1);
        bells.carried(6, 2);
        bells.moved(Some(4), 6);
        assert!(rung(&mut first) && rung(&mut second));

        // A note that came after the look is dropped at the next (it rang already).
        bells.carried(6, 1);
        bells.carried(7, 2);
        bells.moved(Some(6), 7);
        assert!(rung(&mut first), "not the carrier of 7");
        assert!(!rung(&mut second));
        assert!(bells.bells().carried.is_empty());

        // A count that went back (the file restored under us) rings everyone and forgets the
        // notes, so a stale note never speaks for a group of the new counting.
        bells.carried(9, 1);
        bells.moved(Some(7), 5);
        assert!(rung(&mut first) && rung(&mut second));
        bells.carried(6, 2);
        bells.moved(Some(5), 7);
        assert!(rung(&mut first) && rung(&mut second), "7 was never noted");
        assert!(bells.bells().carried.is_empty());

        // A doorbell nobody holds is forgotten; a new one made again for its carrier.
        drop(second);
        bells.ring_all();
        assert!(rung(&mut first));
        assert_eq!(bells.bells().bells.len(), 1);
        let mut again = bells.subscribe(2);
        bells.carried(8, 1);
        bells.moved(Some(7), 8);
        assert!(!rung(&mut first));
        assert!(rung(&mut again));
    }
}
