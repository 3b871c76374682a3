//! A shared budget of bytes that requests take from and give back, counted in units: the
//! memory bound behind [`crate::response_budget`] (large answers waiting for slow clients) and
//! [`crate::request_budget`] (request bodies being read and handled). Both bound what many
//! clients at once can make the server hold; one type keeps their waiting, refusing and
//! reporting the same.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a request waits for budget before it is answered 503.
pub const BUDGET_WAIT: Duration = Duration::from_millis(500);

/// One budget (shared by every clone).
#[derive(Debug, Clone)]
pub struct ByteBudget {
    units: Arc<Semaphore>,
    total_units: u32,
    unit_bytes: usize,
    /// Requests refused for want of budget.
    refused: Arc<AtomicU64>,
    /// Requests waiting for units now (see [`ByteBudget::has_waiters`]).
    waiting: Arc<AtomicUsize>,
}

/// Counts one request among those waiting for a budget while it lives (so a wait cut short
/// by its request being dropped is uncounted too).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn start(waiting: &'a AtomicUsize) -> Self {
        waiting.fetch_add(1, Ordering::Relaxed);
        Self(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ByteBudget {
    /// A budget of `bytes` (at least one unit) in units of `unit_bytes`.
    pub fn new(bytes: usize, unit_bytes: usize) -> Self {
        let unit_bytes = unit_bytes.max(1);
        // `Semaphore::MAX_PERMITS` is far above `u32::MAX` on 64-bit targets.
        let most = u32::try_from(Semaphore::MAX_PERMITS).unwrap_or(u32::MAX);
        let total_units = u32::try_from((bytes / unit_bytes).max(1))
            .unwrap_or(u32::MAX)
            .min(most);
        Self {
            units: Arc::new(Semaphore::new(total_units as usize)),
            total_units,
            unit_bytes,
            refused: Arc::new(AtomicU64::new(0)),
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The units `len` bytes take (all of the budget at most, so that anything larger than
    /// the whole budget is served alone rather than never).
    pub fn units_for(&self, len: usize) -> u32 {
        u32::try_from(len.div_ceil(self.unit_bytes))
            .unwrap_or(u32::MAX)
            .min(self.total_units)
    }

    /// `units` more if they are free now (no refusal counted when not).
    pub fn try_acquire(&self, units: u32) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.units).try_acquire_many_owned(units).ok()
    }

    /// `units` more, waiting at most [`BUDGET_WAIT`]; `None` (counted as a refusal) when they
    /// do not come free in time.
    pub async fn acquire(&self, units: u32) -> Option<OwnedSemaphorePermit> {
        // Nearly always free: taken without arming a timer (every write's body comes here).
        if let Some(permit) = self.try_acquire(units) {
            return Some(permit);
        }
        let _waiting = Waiting::start(&self.waiting);
        let acquire = Arc::clone(&self.units).acquire_many_owned(units);
        match tokio::time::timeout(BUDGET_WAIT, acquire).await {
            Ok(Ok(permit)) => Some(permit),
            // Closed (never, the semaphore is never closed) or timed out.
            _ => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Whether a request is waiting for units now: a holder that is slow to use what it holds
    /// may then be made to give it back (see `request_budget`).
    pub fn has_waiters(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    /// Units free now (for tests).
    pub fn available_units(&self) -> usize {
        self.units.available_permits()
    }

    /// The whole budget in bytes, what is held of it now, and how many requests it refused
    /// (for `/metrics`).
    pub fn usage(&self) -> BudgetUsage {
        let total = self.total_units as usize;
        let held = total.saturating_sub(self.units.available_permits());
        BudgetUsage {
            total_bytes: total.saturating_mul(self.unit_bytes),
            held_bytes: held.saturating_mul(self.unit_bytes),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

/// What [`ByteBudget::usage`] reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetUsage {
    pub total_bytes: usize,
    pub held_bytes: usize,
    pub refused: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn units_round_up_and_never_exceed_the_whole_budget() {
        let budget = ByteBudget::new(10 * 4096, 4096);
        assert_eq!(budget.units_for(1), 1);
        assert_eq!(budget.units_for(4096), 1);
        assert_eq!(budget.units_for(4097), 2);
        assert_eq!(budget.units_for(usize::MAX), 10);
        let held = budget.acquire(7).await.expect("free");
        assert_eq!(budget.usage().held_bytes, 7 * 4096);
        assert!(budget.acquire(4).await.is_none(), "only 3 units are left");
        assert_eq!(budget.usage().refused, 1);
        drop(held);
        assert_eq!(budget.available_units(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_counts_as_waiting_only_while_it_waits() {
        let budget = ByteBudget::new(4 * 4096, 4096);
        let held = budget.acquire(4).await.expect("free");
        assert!(!budget.has_waiters(), "taken at once, never waited");
        let waiter = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(2).await.is_some() }
        });
        tokio::task::yield_now().await;
        assert!(budget.has_waiters());
        drop(held);
        assert!(waiter.await.expect("the waiter ends"), "units came free");
        assert!(!budget.has_waiters());

        // A wait cut short by its request being dropped stops counting too.
        let held = budget.acquire(4).await.expect("free again");
        let dropped = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(1).await.is_some() }
        });
        tokio::task::yield_now().await;
        assert!(budget.has_waiters());
        dropped.abort();
        assert!(dropped.await.is_err(), "cancelled");
        assert!(!budget.has_waiters());
        drop(held);
    }
}
