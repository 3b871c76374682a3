//! The memory budgets of request bodies in flight: from its first byte until its answer is
//! given, a write's body holds its size of budgets shared by every request. Its first
//! [`SMALL_BODY_BYTES`] (all of nearly every write: a span start is a few hundred bytes) hold
//! the budget of small bodies, the write limit times [`SMALL_BODY_BYTES`] (256 MiB at the
//! default limit of 4,096); a body larger than that holds the budget of large bodies instead
//! ([`ServerConfig::request_budget_bytes`](crate::state::ServerConfig), 64 MiB by default,
//! `--request-budget`).
//!
//! Why it exists: nothing else bounds the bodies being read. The write limit (see `overload`)
//! bounds how many writes are handled at once, and a write takes its slot only once its body
//! has arrived; the body limit bounds how large each body is (8 MiB), but not how many
//! arrive at once: a hundred clients sending 8 MB batch bodies at once (an exporter fleet
//! flushing together, or one client opening connections in a loop) took the server to
//! 1,319 MiB of RSS, and nothing stopped a few hundred more (with the budget: 369 MiB,
//! `bench/many_large_bodies.py`). With the budget, a body that does not fit waits up to
//! [`BUDGET_WAIT`] for others to finish, then gets `503 unavailable` with `Retry-After` (over
//! OTLP/gRPC, `UNAVAILABLE`; OTLP exporters retry both) before anything of it is stored.
//!
//! A small body holds what has *arrived* of it, in fine units ([`SMALL_UNIT_BYTES`]), never
//! what it declares: a client that sends a write's head and then trickles its body a byte at
//! a time holds a few bytes, not 64 KiB, so such clients can fill the small budget only by
//! sending its 256 MiB, and only for the 10 s the first 64 KiB of a body may take
//! (`gate::SMALL_BODY_READ_TIMEOUT`), or less: while another body waits for the small budget,
//! a body holding some of it must arrive at 128 KiB/s, as below for the large one. (A write
//! used to take its write slot before its body was read, and the slots bounded small bodies:
//! 4,096 connections that each sent a head and then a byte every few seconds held every slot
//! for the minute a body may take, and every other write got 503 meanwhile; a durability
//! audit's finding. Then as many connections as write slots that each sent 65,500 bytes of a
//! 64 KiB body, trickled the rest and sent it all again when cut off after 10 s held the whole
//! small budget, and every other write got 503: 13 of 13 with 4 slots; an audit's finding.)
//!
//! Past its first [`SMALL_BODY_BYTES`], a body with a declared length takes all of it of the budget
//! of large bodies at once; a body of no declared length (chunked, most gRPC calls) takes its size
//! as it arrives. A hold never waits while holding: one that needs more than is free gives back
//! what it holds and waits for the whole of what it needs in one go ([`BodyHold::cover`]). Taken
//! bit by bit, a hundred 8 MB bodies arriving together each took a share of the budget and then
//! waited for more, none could finish, and all hundred were refused; taken whole, eight are handled
//! at a time. A body larger than the whole budget takes all of it, so it is handled alone rather
//! than never. A large body used to take its declared length before its first byte was read: eight
//! connections that each sent the head of an 8 MB batch and nothing more held the whole 64 MiB, ten
//! seconds at a time, and 43 of 44 batches of 200 KB meanwhile got 503. A head now holds nothing; a
//! client waiting for `100 Continue` is still refused before it sends a body that would not fit
//! ([`BodyHold::cover_declared`]). And a body holding some of a budget while another request
//! waits for it must be arriving at 128 KiB/s or give it up and be refused
//! (`gate::MIN_BODY_RATE_WHILE_AWAITED`): else a client sending 64 KiB and then a byte every few
//! seconds held 8 MB for the minute a body may take. Small bodies never wait behind large ones, as
//! small answers never wait behind large answers in the response budget: the two budgets are
//! separate semaphores (a semaphore serves waiters in order, and a waiting hold takes the units
//! that come free: 2-op batches took 253 ms at the median behind 900 KB bodies, and some were
//! refused, while 124 KB of the budget was free; an audit's finding).
//!
//! A body refused partway (it did not fit when more of it arrived, or it was too slow while
//! another request waited for its share) gives back what it held at once, and is answered
//! once the rest of it has been read and dropped (at most 10 s, see `gate::drain`), so that
//! the client reads the answer rather than a reset connection.
//!
//! Not counted: hyper's read buffer of each connection, which grows with what a client sends
//! at once (up to 32 KiB, the head limit `parse_error_body::MAX_HEAD_BYTES`; hyper's default
//! was 408 KiB) and is kept while the connection lives. 500 idle keep-alive connections that
//! had each sent a 60 KB journal append took the server from 14 to 40 MiB of RSS (68 MiB
//! with the old limit); `--max-connections` bounds how many there are (see
//! `connection_limit`).
//!
//! A compressed OTLP body (`Content-Encoding: gzip` or `deflate`) also holds what it inflates
//! to, counted by inflating it once into nothing before it is decoded (see `gate`): it may
//! inflate to 8 times the body limit. What a body becomes once parsed (JSON values, decoded
//! protobuf, spans mapped and written) is not counted: it grows with the (inflated) body, so
//! bounding the bodies bounds it too, but by a factor: one 52 MB OTLP request peaked at about
//! 470 MB of RSS (a 7.6 MB gzipped OTLP/JSON export inflating to 50 MB, at about 400 MB).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

pub use crate::byte_budget::BUDGET_WAIT;
use crate::byte_budget::{BudgetUsage, ByteBudget};
use crate::error::ApiError;

/// The budget of large bodies is counted in units of this many bytes.
const UNIT_BYTES: usize = 1 << 12;

/// The budget of small bodies is counted in units of this many bytes: fine, so that a body
/// holds about what has arrived of it.
pub const SMALL_UNIT_BYTES: usize = 64;

/// Bodies up to this size hold the budget of small bodies, larger ones the budget of large
/// bodies (see the module doc).
pub const SMALL_BODY_BYTES: usize = 1 << 16;

/// The shared budgets of request bodies (one per server).
#[derive(Debug, Clone)]
pub struct RequestBudget {
    large: ByteBudget,
    small: ByteBudget,
    /// Bodies refused for arriving too slowly while another request waited for their share.
    slow_refused: Arc<AtomicU64>,
}

impl RequestBudget {
    /// Budgets of `large_bytes` for bodies over [`SMALL_BODY_BYTES`] and of `small_bytes` for
    /// the others (each at least one unit).
    pub fn new(large_bytes: usize, small_bytes: usize) -> Self {
        Self {
            large: ByteBudget::new(large_bytes, UNIT_BYTES),
            small: ByteBudget::new(small_bytes, SMALL_UNIT_BYTES),
            slow_refused: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The budget of small bodies for a write limit of `write_limit` writes handled at once:
    /// one small body's worth each, the bound the write slots gave when they were taken
    /// before the body was read.
    pub fn small_bytes_for(write_limit: usize) -> usize {
        write_limit.saturating_mul(SMALL_BODY_BYTES)
    }

    /// A hold on nothing yet, for one request's body.
    pub fn hold(&self) -> BodyHold {
        BodyHold {
            budget: self.clone(),
            large: Share::default(),
            small: Share::default(),
            declared: 0,
        }
    }

    /// The budget of large bodies in bytes, what bodies hold of it now, and how many requests
    /// it has refused (for `/metrics`).
    pub fn usage(&self) -> BudgetUsage {
        self.large.usage()
    }

    /// The same of the budget of small bodies.
    pub fn small_usage(&self) -> BudgetUsage {
        self.small.usage()
    }

    /// How many bodies were refused for arriving too slowly while another request waited for
    /// their share of a budget (for `/metrics`).
    pub fn slow_refused(&self) -> u64 {
        self.slow_refused.load(Ordering::Relaxed)
    }
}

/// What one request's body holds of one budget.
#[derive(Debug, Default)]
struct Share {
    permit: Option<OwnedSemaphorePermit>,
    /// The body bytes the held units cover.
    covered: usize,
}

impl Share {
    /// Cover `len` bytes of `budget`: what is missing, taken at once if it is free; else what
    /// the share has goes back and the whole of it is waited for (at most [`BUDGET_WAIT`]), so
    /// no share waits while holding. `false` when it does not come free, the share then
    /// holding nothing.
    async fn cover(&mut self, budget: &ByteBudget, len: usize) -> bool {
        if len <= self.covered {
            return true;
        }
        let wanted = budget.units_for(len);
        let held = self
            .permit
            .as_ref()
            .map_or(0, |permit| permit.num_permits());
        let held = u32::try_from(held).unwrap_or(u32::MAX);
        if wanted > held {
            let more = match budget.try_acquire(wanted - held) {
                Some(more) => Some(more),
                None => {
                    self.release();
                    budget.acquire(wanted).await
                }
            };
            let Some(more) = more else {
                return false;
            };
            match &mut self.permit {
                Some(permit) => permit.merge(more),
                None => self.permit = Some(more),
            }
        }
        self.covered = len;
        true
    }

    fn release(&mut self) {
        self.permit = None;
        self.covered = 0;
    }
}

/// What one request's body holds of the budgets, given back when it is dropped (after the
/// request's answer).
#[derive(Debug)]
pub struct BodyHold {
    budget: RequestBudget,
    large: Share,
    small: Share,
    /// The length the body declared when it is over [`SMALL_BODY_BYTES`], else 0.
    declared: usize,
}

impl BodyHold {
    /// Note that the body declares `len` bytes, before any of it is read. A large body takes
    /// all of it once its first [`SMALL_BODY_BYTES`] have arrived (see [`BodyHold::cover`]),
    /// not before: a head alone holds nothing. A client waiting for `100 Continue`
    /// (`waits_to_send`) has sent nothing and sends nothing unless told to: it is refused
    /// here (503) when its body would not fit within [`BUDGET_WAIT`], so that it never sends a
    /// body only to see it refused; what this waits for is given back at once.
    pub async fn cover_declared(
        &mut self,
        len: usize,
        waits_to_send: bool,
    ) -> Result<(), ApiError> {
        if len <= SMALL_BODY_BYTES {
            return Ok(());
        }
        self.declared = len;
        if waits_to_send {
            let fits = self.large.cover(&self.budget.large, len).await;
            self.large.release();
            if !fits {
                return Err(self.large_refusal(len));
            }
        }
        Ok(())
    }

    /// Hold enough for `len` bytes of body (what has arrived, or what it inflates to): of the
    /// budget of small bodies up to [`SMALL_BODY_BYTES`]; past it, of the budget of large
    /// bodies, all of what the body declared if that is more (the small share then given
    /// back). 503 when it does not come free within [`BUDGET_WAIT`], the hold then holding
    /// nothing of that budget (nor, past 64 KiB, of the other).
    pub async fn cover(&mut self, len: usize) -> Result<(), ApiError> {
        if len <= SMALL_BODY_BYTES {
            if self.large.covered > 0 || self.small.cover(&self.budget.small, len).await {
                return Ok(());
            }
            let total = self.budget.small_usage().total_bytes;
            return Err(ApiError::Unavailable(format!(
                "the server is reading and handling many request bodies at once, and what has \
                 arrived of them holds its budget of {total} bytes for the first 64 KiB of \
                 each body (64 KiB a slot of --max-inflight-writes), which has no room for \
                 this body now: retry shortly"
            )));
        }
        let len = len.max(self.declared);
        if !self.large.cover(&self.budget.large, len).await {
            // A refused body is drained, not kept: its first 64 KiB go back too (they stayed
            // held while it drained, up to 10 s; an audit's finding).
            self.small.release();
            return Err(self.large_refusal(len));
        }
        self.small.release();
        Ok(())
    }

    /// Whether the body holds some of the budget of large bodies.
    pub fn holds_large(&self) -> bool {
        self.large.covered > 0
    }

    /// Whether the body holds some of a budget (the large one once it holds any of it, else the
    /// small one) while another request waits for that budget: a slow body then gives way (see
    /// `gate::read_whole`).
    pub fn share_is_awaited(&self) -> bool {
        if self.holds_large() {
            self.budget.large.has_waiters()
        } else {
            self.small.covered > 0 && self.budget.small.has_waiters()
        }
    }

    /// Give back everything held, before the answer (a body that stalled).
    pub fn release(&mut self) {
        self.large.release();
        self.small.release();
    }

    /// Give back everything held by a body refused for arriving too slowly while another
    /// request waited for its share, and count it.
    pub fn refuse_as_slow(&mut self) {
        self.release();
        self.budget.slow_refused.fetch_add(1, Ordering::Relaxed);
    }

    fn large_refusal(&self, len: usize) -> ApiError {
        let total = self.budget.usage().total_bytes;
        ApiError::Unavailable(format!(
            "the server is reading and handling other requests' bodies, which hold its budget \
             of {total} bytes for bodies in flight (--request-budget); this body of {len} \
             bytes does not fit now: retry shortly"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_hold_grows_with_its_body_and_gives_everything_back_when_dropped() {
        let budget = RequestBudget::new(640 * 1024, SMALL_BODY_BYTES);
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
    async fn small_bodies_hold_what_arrived_of_their_own_budget_and_never_wait_behind_large_ones() {
        let budget = RequestBudget::new(128 * 1024, 2 * SMALL_BODY_BYTES);
        let mut large = budget.hold();
        large
            .cover(128 * 1024)
            .await
            .expect("the whole large budget");

        // A small body declares its length and holds nothing for it: only what arrives.
        let mut trickling = budget.hold();
        trickling
            .cover_declared(SMALL_BODY_BYTES, false)
            .await
            .expect("nothing to hold");
        assert_eq!(budget.small_usage().held_bytes, 0);
        trickling.cover(1).await.expect("one byte arrived");
        assert_eq!(budget.small_usage().held_bytes, SMALL_UNIT_BYTES);

        let mut small = budget.hold();
        small
            .cover(SMALL_BODY_BYTES)
            .await
            .expect("no wait behind the large body, no refusal");
        assert_eq!(budget.usage().refused, 0);
        assert_eq!(
            budget.small_usage().held_bytes,
            SMALL_BODY_BYTES + SMALL_UNIT_BYTES
        );

        // Past the small size a body moves to the large budget, and gives its small share back.
        assert!(
            small.cover(SMALL_BODY_BYTES + 1).await.is_err(),
            "the large budget is all held"
        );
        drop(large);
        small
            .cover(SMALL_BODY_BYTES + 1)
            .await
            .expect("room in the large budget");
        assert_eq!(budget.small_usage().held_bytes, SMALL_UNIT_BYTES);
        small.cover(10).await.expect("covered by its large share");
        assert_eq!(budget.small_usage().held_bytes, SMALL_UNIT_BYTES);
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_declared_body_takes_its_whole_length_once_its_first_64_kib_arrived() {
        let budget = RequestBudget::new(640 * 1024, 4 * SMALL_BODY_BYTES);
        let mut hold = budget.hold();
        hold.cover_declared(500_000, false)
            .await
            .expect("a head holds nothing");
        assert_eq!(budget.usage().held_bytes, 0);
        hold.cover(30_000).await.expect("room");
        assert_eq!(budget.usage().held_bytes, 0);
        assert_eq!(budget.small_usage().held_bytes, 30_016);
        hold.cover(SMALL_BODY_BYTES + 1).await.expect("room");
        assert_eq!(budget.usage().held_bytes, 503_808, "all of 500,000 bytes");
        assert_eq!(budget.small_usage().held_bytes, 0);
        assert!(hold.holds_large());
        assert!(!hold.share_is_awaited(), "nobody waits");

        // Another body crossing 64 KiB waits for what it declared; meanwhile the first one's
        // share is awaited.
        let mut other = budget.hold();
        other.cover_declared(300_000, false).await.expect("a head");
        let waiting = tokio::spawn(async move {
            let taken = other.cover(SMALL_BODY_BYTES + 1).await.is_ok();
            (other, taken)
        });
        tokio::task::yield_now().await;
        assert!(hold.share_is_awaited());
        hold.release();
        let (other, taken) = waiting.await.expect("the waiter ends");
        assert!(taken, "the share given back went to the one waiting");
        assert_eq!(budget.usage().held_bytes, 303_104);
        drop(other);
        assert_eq!(budget.usage().held_bytes, 0);
        assert_eq!(budget.usage().refused, 0);

        // A body refused the large budget gives back its first 64 KiB too: it is drained, not
        // kept.
        let mut first = budget.hold();
        first.cover(600_000).await.expect("room");
        let mut refused = budget.hold();
        refused
            .cover_declared(300_000, false)
            .await
            .expect("a head");
        refused.cover(SMALL_BODY_BYTES).await.expect("room");
        assert_eq!(budget.small_usage().held_bytes, SMALL_BODY_BYTES);
        assert!(
            refused.cover(SMALL_BODY_BYTES + 1).await.is_err(),
            "no room"
        );
        assert_eq!(budget.small_usage().held_bytes, 0);
        assert_eq!(budget.usage().held_bytes, 602_112);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_awaiting_100_continue_is_refused_before_it_is_sent_when_it_would_not_fit() {
        let budget = RequestBudget::new(640 * 1024, SMALL_BODY_BYTES);
        let mut first = budget.hold();
        first.cover(400_000).await.expect("room");
        let mut waits = budget.hold();
        let refusal = waits
            .cover_declared(300_000, true)
            .await
            .expect_err("no room for 300,000 bytes");
        assert!(matches!(refusal, ApiError::Unavailable(_)), "{refusal:?}");
        waits
            .cover_declared(200_000, true)
            .await
            .expect("room for 200,000 bytes");
        assert_eq!(
            budget.usage().held_bytes,
            401_408,
            "the check holds nothing once done"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn small_bodies_past_their_budget_are_refused() {
        let budget = RequestBudget::new(128 * 1024, 1024);
        let mut first = budget.hold();
        first.cover(900).await.expect("room");
        let mut second = budget.hold();
        second.cover(64).await.expect("room for one unit");
        let refusal = second.cover(200).await.expect_err("no room");
        assert!(matches!(refusal, ApiError::Unavailable(_)), "{refusal:?}");
        assert!(
            refusal.to_string().contains("--max-inflight-writes"),
            "{refusal}"
        );
        assert_eq!(budget.small_usage().refused, 1);
        // The refused hold gave back what it had while it waited.
        assert_eq!(budget.small_usage().held_bytes, 15 * SMALL_UNIT_BYTES);
        drop(first);
        second.cover(200).await.expect("room now");
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_body_is_awaited_only_by_a_body_waiting_for_the_small_budget() {
        let budget = RequestBudget::new(128 * 1024, SMALL_BODY_BYTES);
        let mut small = budget.hold();
        assert!(!small.share_is_awaited(), "holds nothing yet");
        small.cover(SMALL_BODY_BYTES).await.expect("room");
        let mut large = budget.hold();
        large
            .cover(128 * 1024)
            .await
            .expect("the whole large budget");

        // A body waiting for the large budget awaits the large body, not the small one.
        let waiting_large = tokio::spawn({
            let mut hold = budget.hold();
            async move { hold.cover(100_000).await.is_ok() }
        });
        tokio::task::yield_now().await;
        assert!(large.share_is_awaited());
        assert!(!small.share_is_awaited());
        drop(large);
        assert!(waiting_large.await.expect("the waiter ends"));

        // A body waiting for the small budget awaits the small body.
        let waiting_small = tokio::spawn({
            let mut hold = budget.hold();
            async move { hold.cover(100).await.is_ok() }
        });
        tokio::task::yield_now().await;
        assert!(small.share_is_awaited());
        small.release();
        assert!(!small.share_is_awaited(), "holds nothing any more");
        assert!(waiting_small.await.expect("the waiter ends"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_larger_than_the_whole_budget_is_handled_alone() {
        let budget = RequestBudget::new(128 * 1024, SMALL_BODY_BYTES);
        let mut huge = budget.hold();
        huge.cover(1 << 20).await.expect("takes the whole budget");
        let mut other = budget.hold();
        assert!(other.cover(70_000).await.is_err(), "nothing is left");
        drop(huge);
        other.cover(70_000).await.expect("room again");
    }
}
