//! The memory budget of request bodies in flight: from its first byte until its answer is
//! given, a write's body holds its size of a budget shared by every request
//! ([`ServerConfig::request_budget_bytes`](crate::state::ServerConfig), 64 MiB by default,
//! `--request-budget`).
//!
//! Why it exists: the write limit (see `overload`) bounds how many write requests are handled
//! at once (4,096), and the body limit how large each body is (8 MiB), but not their product:
//! a hundred clients sending 8 MB batch bodies at once (an exporter fleet flushing together, or
//! one client opening connections in a loop) took the server to 1,319 MiB of RSS, and nothing
//! stopped a few hundred more (with the budget: 369 MiB, `bench/many_large_bodies.py`). With
//! the budget, a body that does not fit waits up to [`BUDGET_WAIT`] for others to finish, then gets `503 unavailable` with `Retry-After` (over
//! OTLP/gRPC, `UNAVAILABLE`; OTLP exporters retry both) before anything of it is stored.
//!
//! A body with a declared length takes all of it before its first byte is read; a body of no
//! declared length (chunked, most gRPC calls) takes its size as it arrives. A hold never waits
//! while holding: one that needs more than is free gives back what it holds and waits for the
//! whole of what it needs in one go ([`BodyHold::cover`]). Taken bit by bit, a hundred 8 MB
//! bodies arriving together each took a share of the budget and then waited for more, none
//! could finish, and all hundred were refused; taken whole, eight are handled at a time. A
//! body larger than the whole budget takes all of it, so it is handled alone rather than never.
//! The cost: a client that declares 8 MB and then sends a byte every few seconds holds 8 MB
//! of the budget for up to the minute a body may take (`BODY_READ_TIMEOUT`), as it holds a
//! write slot; with tokens configured, only a client with the `ingest` scope can.
//!
//! Bodies of at most [`SMALL_BODY_BYTES`] never touch the budget (nearly every write: a span
//! start is a few hundred bytes), as small answers never touch the response budget: the
//! write slots bound them (4,096 × 64 KiB), and they never wait behind a large body that waits
//! for room (the semaphore serves waiters in order, and a waiting hold takes the units that
//! come free: 2-op batches took 253 ms at the median behind 900 KB bodies, and some were
//! refused, while 124 KB of the budget was free; an audit's finding).
//!
//! A compressed OTLP body (`Content-Encoding: gzip` or `deflate`) also holds what it inflates
//! to, counted by inflating it once into nothing before it is decoded (see `gate`): it may
//! inflate to 8 times the body limit. What a body becomes once parsed (JSON values, decoded
//! protobuf, spans mapped and written) is not counted: it grows with the (inflated) body, so
//! bounding the bodies bounds it too, but by a factor: one 52 MB OTLP request peaked at about
//! 470 MB of RSS (a 7.6 MB gzipped OTLP/JSON export inflating to 50 MB, at about 400 MB).

use tokio::sync::OwnedSemaphorePermit;

pub use crate::byte_budget::BUDGET_WAIT;
use crate::byte_budget::{BudgetUsage, ByteBudget};
use crate::error::ApiError;

/// The budget is counted in units of this many bytes.
const UNIT_BYTES: usize = 1 << 12;

/// Bodies up to this size are read without the budget (see the module doc).
pub const SMALL_BODY_BYTES: usize = 1 << 16;

/// The shared budget of request bodies (one per server).
#[derive(Debug, Clone)]
pub struct RequestBudget {
    bytes: ByteBudget,
}

impl RequestBudget {
    /// A budget of `bytes` (at least one unit).
    pub fn new(bytes: usize) -> Self {
        Self {
            bytes: ByteBudget::new(bytes, UNIT_BYTES),
        }
    }

    /// A hold on nothing yet, for one request's body.
    pub fn hold(&self) -> BodyHold {
        BodyHold {
            budget: self.clone(),
            permit: None,
            covered: 0,
        }
    }

    /// The whole budget in bytes, what bodies hold of it now, and how many requests it has
    /// refused (for `/metrics`).
    pub fn usage(&self) -> BudgetUsage {
        self.bytes.usage()
    }
}

/// What one request's body holds of the budget, given back when it is dropped (after the
/// request's answer).
#[derive(Debug)]
pub struct BodyHold {
    budget: RequestBudget,
    permit: Option<OwnedSemaphorePermit>,
    /// The body bytes the held units cover.
    covered: usize,
}

impl BodyHold {
    /// Hold enough for a body of `len` bytes: what is missing, taken at once if it is free;
    /// else what the hold has goes back and the whole of it is waited for (at most
    /// [`BUDGET_WAIT`]), so no hold waits while holding (see the module doc). 503 when it does
    /// not come free, the hold then holding nothing.
    pub async fn cover(&mut self, len: usize) -> Result<(), ApiError> {
        if len <= self.covered || len <= SMALL_BODY_BYTES {
            return Ok(());
        }
        let wanted = self.budget.bytes.units_for(len);
        let held = self
            .permit
            .as_ref()
            .map_or(0, |permit| permit.num_permits());
        let held = u32::try_from(held).unwrap_or(u32::MAX);
        if wanted > held {
            let more = match self.budget.bytes.try_acquire(wanted - held) {
                Some(more) => Some(more),
                None => {
                    self.permit = None;
                    self.covered = 0;
                    self.budget.bytes.acquire(wanted).await
                }
            };
            let Some(more) = more else {
                let total = self.budget.usage().total_bytes;
                return Err(ApiError::Unavailable(format!(
                    "the server is reading and handling other requests' bodies, which hold its \
                     budget of {total} bytes for bodies in flight (--request-budget); this body \
                     of {len} bytes does not fit now: retry shortly"
                )));
            };
            match &mut self.permit {
                Some(permit) => permit.merge(more),
                None => self.permit = Some(more),
            }
        }
        self.covered = len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_hold_grows_with_its_body_and_gives_everything_back_when_dropped() {
        let budget = RequestBudget::new(640 * 1024);
        let mut first = budget.hold();
        first.cover(100_000).await.expect("room");
        first.cover(50_000).await.expect("already covered");
        first.cover(400_000).await.expect("room");
        assert_eq!(budget.usage().held_bytes, 401_408);

        // 248 KiB are left: a body of 300,000 bytes waits, then is refused.
        let mut second = budget.hold();
        let refusal = second.cover(300_000).await.expect_err("no room");
        assert!(matches!(refusal, ApiError::Unavailable(_)), "{refusal:?}");
        assert_eq!(budget.usage().refused, 1);
        second.cover(200_000).await.expect("room for this one");

        // Needing more than is free, a hold gives back what it has while it waits: 196 KiB
        // held and 52 KiB free, 300,000 bytes more is refused, and the hold then holds nothing.
        let refusal = second.cover(500_000).await.expect_err("no room");
        assert!(matches!(refusal, ApiError::Unavailable(_)), "{refusal:?}");
        assert_eq!(budget.usage().held_bytes, 401_408);

        drop(first);
        second.cover(500_000).await.expect("room now");
        assert_eq!(budget.usage().held_bytes, 503_808);
        drop(second);
        assert_eq!(budget.usage().held_bytes, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn small_bodies_never_touch_the_budget() {
        let budget = RequestBudget::new(128 * 1024);
        let mut large = budget.hold();
        large.cover(128 * 1024).await.expect("the whole budget");
        let mut small = budget.hold();
        small
            .cover(SMALL_BODY_BYTES)
            .await
            .expect("no wait, no refusal");
        assert_eq!(budget.usage().refused, 0);
        assert!(
            small.cover(SMALL_BODY_BYTES + 1).await.is_err(),
            "past the small size it is charged"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_larger_than_the_whole_budget_is_handled_alone() {
        let budget = RequestBudget::new(128 * 1024);
        let mut huge = budget.hold();
        huge.cover(1 << 20).await.expect("takes the whole budget");
        let mut other = budget.hold();
        assert!(other.cover(70_000).await.is_err(), "nothing is left");
        drop(huge);
        other.cover(70_000).await.expect("room again");
    }
}
