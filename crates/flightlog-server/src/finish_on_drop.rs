//! A write runs to its answer, holding what it holds, even when its client goes away.
//!
//! Why it exists: hyper drops a request's future when its client closes the connection, and a
//! write's future holds its slot of the write limit (see `overload`) and its share of the
//! budgets of bodies (see `request_budget`). A write the store had already queued went on
//! without them: the store commits what it queued whether anyone waits for the answer or not.
//! So clients that gave up on their writes (an exporter's timeout, a script killed mid-call)
//! took their slots and budget back while their bodies sat in the store's queue: with
//! `--max-inflight-writes 1` and the store waiting for another process's lock, 40 such writes
//! of 1 MiB left no write in flight by `/metrics` and 39 in the store's queue, and took the
//! server from 30 to 174 MB of RSS (an audit's finding); every retry of a timed-out write
//! added one more. With this, a write whose future is dropped before its answer goes on as a
//! task of its own, still holding its slot and budget until the store has answered it, so the
//! write limit bounds the writes in the store's queue whatever their clients do. Nothing is
//! written that would not have been: the store had queued it, or would have, and a client that
//! went away never learns either way (it retries, as after any lost answer).
//!
//! The common path costs one allocation (the handler's future is boxed so that it can move to
//! a task of its own) and nothing else: no task is spawned unless the future is dropped
//! unfinished.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A write handler's future holding `held` (its slot and budget) until it completes. Dropped
/// unfinished, it goes on as a task of its own, still holding `held`, and `on_abandoned` gets
/// its output (to count it).
pub(crate) struct FinishOnDrop<F, H, A>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
    H: Send + 'static,
    A: FnOnce(F::Output) + Send + 'static,
{
    running: Option<Running<F, H, A>>,
}

struct Running<F: Future, H, A> {
    future: Pin<Box<F>>,
    held: H,
    on_abandoned: A,
}

impl<F, H, A> FinishOnDrop<F, H, A>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
    H: Send + 'static,
    A: FnOnce(F::Output) + Send + 'static,
{
    pub(crate) fn new(future: F, held: H, on_abandoned: A) -> Self {
        Self {
            running: Some(Running {
                future: Box::pin(future),
                held,
                on_abandoned,
            }),
        }
    }
}

// Nothing in it is ever pinned in place: the future is boxed, and `held` and `on_abandoned` are
// only moved.
impl<F, H, A> Unpin for FinishOnDrop<F, H, A>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
    H: Send + 'static,
    A: FnOnce(F::Output) + Send + 'static,
{
}

impl<F, H, A> Future for FinishOnDrop<F, H, A>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
    H: Send + 'static,
    A: FnOnce(F::Output) + Send + 'static,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // Out of `self` while it is polled: a handler that panics unwinds with it, so what it
        // held goes back and `drop` finds nothing to go on with (a panicked future polled again
        // panics again, with a misleading message).
        let Some(mut running) = this.running.take() else {
            // Polled again after its output was taken: `.await` never does.
            debug_assert!(false, "FinishOnDrop polled after it completed");
            return Poll::Pending;
        };
        match running.future.as_mut().poll(cx) {
            // What it held goes back with the answer.
            Poll::Ready(output) => Poll::Ready(output),
            Poll::Pending => {
                this.running = Some(running);
                Poll::Pending
            }
        }
    }
}

impl<F, H, A> Drop for FinishOnDrop<F, H, A>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
    H: Send + 'static,
    A: FnOnce(F::Output) + Send + 'static,
{
    fn drop(&mut self) {
        let Some(Running {
            future,
            held,
            on_abandoned,
        }) = self.running.take()
        else {
            return;
        };
        // Outside a runtime there is nothing to run it on: it is dropped as before. A runtime
        // shutting down takes the task and drops it at once (tokio shuts down what is spawned
        // on a closed runtime), which gives back what it held.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let output = future.await;
                drop(held);
                on_abandoned(output);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::{oneshot, Semaphore};

    #[tokio::test]
    async fn a_finished_future_gives_its_output_and_what_it_held_back() {
        let slots = Arc::new(Semaphore::new(1));
        let slot = Arc::clone(&slots).acquire_owned().await.expect("a slot");
        let (abandoned, mut heard) = oneshot::channel::<u32>();
        let output = FinishOnDrop::new(async { 7 }, slot, move |output| {
            let _ = abandoned.send(output);
        })
        .await;
        assert_eq!(output, 7);
        assert_eq!(slots.available_permits(), 1);
        assert!(heard.try_recv().is_err(), "not abandoned");
    }

    #[tokio::test]
    async fn a_handler_that_panics_gives_back_what_it_held_and_is_not_run_again() {
        let slots = Arc::new(Semaphore::new(1));
        let slot = Arc::clone(&slots).acquire_owned().await.expect("a slot");
        let (abandoned, heard) = oneshot::channel::<()>();
        let panicking = FinishOnDrop::new(
            async {
                panic!("a handler's bug");
            },
            slot,
            move |()| {
                let _ = abandoned.send(());
            },
        );
        let joined = tokio::spawn(panicking).await;
        assert!(joined.is_err_and(|err| err.is_panic()));
        assert_eq!(slots.available_permits(), 1, "given back by the unwind");
        assert!(
            heard.await.is_err(),
            "nothing went on with the panicked future"
        );
    }

    #[tokio::test]
    async fn a_future_dropped_unfinished_runs_to_its_end_holding_what_it_held() {
        let slots = Arc::new(Semaphore::new(1));
        let slot = Arc::clone(&slots).acquire_owned().await.expect("a slot");
        let (answer, answered) = oneshot::channel::<u32>();
        let (abandoned, heard) = oneshot::channel::<u32>();
        let waiting = FinishOnDrop::new(
            async move { answered.await.unwrap_or(0) },
            slot,
            move |output| {
                let _ = abandoned.send(output);
            },
        );
        // The client goes away: its request's future is dropped before the answer.
        let dropped = tokio::time::timeout(Duration::from_millis(20), waiting).await;
        assert!(dropped.is_err(), "it was waiting");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(slots.available_permits(), 0, "still held after the drop");
        answer.send(9).expect("the task waits for it");
        assert_eq!(heard.await.expect("counted as abandoned"), 9);
        assert_eq!(slots.available_permits(), 1, "given back with the answer");
    }
}
