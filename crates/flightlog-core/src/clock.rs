//! Time and writer identity, injected so every time-dependent behaviour is testable.
//!
//! The stores never call the system clock directly: they ask a [`Clock`]. Production code uses
//! [`SystemClock`]; tests, the conformance replayer and `serve --manual-clock` use
//! [`ManualClock`], which only moves when told to.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of "now" in epoch milliseconds.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time, epoch milliseconds.
    fn now_ms(&self) -> i64;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        // A clock before 1970 is a broken machine, not an input; 0 keeps the store running.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that stands still until [`ManualClock::set`] moves it.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        Self {
            now: AtomicI64::new(now_ms),
        }
    }

    /// Move the clock (forwards or backwards) to `now_ms`.
    pub fn set(&self, now_ms: i64) {
        self.now.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// The default writer identity of a store instance: `pid:<pid>:<start-ms>`.
///
/// The start time makes two lives of the same pid distinct, so a restarted process never
/// mistakes a dead predecessor's open spans for its own.
pub fn default_writer_id(clock: &dyn Clock) -> String {
    format!("pid:{}:{}", std::process::id(), clock.now_ms())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_set() {
        let clock = ManualClock::new(5);
        assert_eq!(clock.now_ms(), 5);
        clock.set(-3);
        assert_eq!(clock.now_ms(), -3);
    }

    #[test]
    fn default_writer_id_names_pid_and_start() {
        let clock = ManualClock::new(1234);
        assert_eq!(
            default_writer_id(&clock),
            format!("pid:{}:1234", std::process::id())
        );
    }
}
