//! The connection limit: at most `max_connections` connections are served at once, over both
//! listeners (the HTTP API and OTLP/gRPC); past it, a listener that has accepted a client
//! waits for a slot before it serves it and accepts no other, so the clients beyond wait (that
//! one socket unread, the rest in the kernel's listen queue).
//!
//! Why it exists: every open connection holds memory no request budget counts, before any
//! token is checked: hyper's read buffer of an HTTP/1 connection (up to its request head limit,
//! `parse_error_body::MAX_HEAD_BYTES`, while a head arrives) and an HTTP/2 connection's flow
//! control window (what a peer may send before a request reads it). With no limit, the process's
//! file-descriptor limit was the only bound (the server raises it to the hard limit, often
//! hundreds of thousands): 2,000 connections that each sent 390 KiB of an unfinished request
//! head took the server from 14 MiB to 801 MiB of RSS, without a token.
//!
//! Waiting, not refusing: a connection accepted only to be closed again tells the client
//! nothing an HTTP answer would, and reading a request to answer it is what costs the memory.
//! The operator is told on stderr (at most every 10 s) that the limit was reached, and
//! `/metrics` shows the connections open and how often the limit was reached.
//!
//! What it does not stop: anyone who can connect can take every slot (idle keep-alive
//! connections, heads trickled within the 30 s a head may take), as anyone could take every
//! file descriptor before; a token is checked only once a request has arrived. The limit trades
//! that, at a bar of 4,096 connections by default, for memory that cannot run out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How often, at most, reaching the limit is said on stderr.
const WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// The connection limit shared by the listeners (cloned into each; one count).
#[derive(Debug, Clone)]
pub struct ConnectionSlots {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    slots: Arc<Semaphore>,
    limit: usize,
    /// How many times a client arrived while every slot was taken (it waited for one).
    reached: AtomicU64,
    last_warning: Mutex<Option<Instant>>,
}

/// One open connection's slot; given back when dropped (when the connection ends).
#[derive(Debug)]
pub struct ConnectionSlot {
    _permit: OwnedSemaphorePermit,
}

impl ConnectionSlots {
    /// A limit of `limit` connections at once (capped at what a semaphore can count).
    pub fn new(limit: usize) -> Self {
        let limit = limit.min(Semaphore::MAX_PERMITS);
        Self {
            inner: Arc::new(Inner {
                slots: Arc::new(Semaphore::new(limit)),
                limit,
                reached: AtomicU64::new(0),
                last_warning: Mutex::new(None),
            }),
        }
    }

    /// A slot for a connection just accepted: at once while fewer than the limit are open, else
    /// once one closes (said on stderr, at most every 10 s). `None` only if the slots were
    /// closed, which nothing does.
    pub async fn acquire(&self) -> Option<ConnectionSlot> {
        let slots = Arc::clone(&self.inner.slots);
        match slots.clone().try_acquire_owned() {
            Ok(permit) => return Some(ConnectionSlot { _permit: permit }),
            Err(tokio::sync::TryAcquireError::Closed) => return None,
            Err(tokio::sync::TryAcquireError::NoPermits) => {}
        }
        self.inner.reached.fetch_add(1, Ordering::Relaxed);
        self.warn_full();
        slots
            .acquire_owned()
            .await
            .ok()
            .map(|permit| ConnectionSlot { _permit: permit })
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// Connections open now (holding a slot).
    pub fn open(&self) -> usize {
        self.inner
            .limit
            .saturating_sub(self.inner.slots.available_permits())
    }

    /// How many times a client arrived while every slot was taken.
    pub fn times_reached(&self) -> u64 {
        self.inner.reached.load(Ordering::Relaxed)
    }

    fn warn_full(&self) {
        let now = Instant::now();
        {
            let Ok(mut last) = self.inner.last_warning.lock() else {
                return;
            };
            if last.is_some_and(|last| now.duration_since(last) < WARNING_INTERVAL) {
                return;
            }
            *last = Some(now);
        }
        // Written, not `eprintln!`: a closed stderr must not panic the server.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr().lock(),
            "flightlog: warning: {} connections are open, the most --max-connections allows; \
             further connections wait until one closes (raise \
             --max-connections, or look for clients that keep connections open without using \
             them)",
            self.inner.limit
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slot_comes_free_when_a_connection_ends_and_the_limit_reached_is_counted() {
        let slots = ConnectionSlots::new(2);
        let first = slots.acquire().await.expect("a slot");
        let second = slots.acquire().await.expect("a slot");
        assert_eq!(
            (slots.open(), slots.limit(), slots.times_reached()),
            (2, 2, 0)
        );
        let waiting = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a third connection waits");
        assert_eq!(slots.times_reached(), 1);
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the third gets the slot the first gave back")
            .expect("the task ran");
        assert!(third.is_some());
        assert_eq!(slots.open(), 2);
        drop((second, third));
        assert_eq!(slots.open(), 0);
    }
}
