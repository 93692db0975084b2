//! One request per node, sent together, answers taken as they arrive: [`Fanout`].

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;

use lock_core::Result;

type Request<T> = Pin<Box<dyn Future<Output = Result<T>> + Send>>;

/// The requests of one operation, one per node. Every request is handed to its node's
/// connection on the first poll, so dropping a `Fanout` does not recall the requests still
/// in flight (their answers are ignored).
///
/// A handful of nodes is polled together under one waker: cheaper than a
/// `FuturesUnordered` (no task per request, no ready queue) for the N ≤ 10 of a Redlock.
pub(crate) struct Fanout<T> {
    pending: Vec<(usize, Request<T>)>,
}

impl<T: Send + 'static> Fanout<T> {
    pub(crate) fn new(requests: Vec<(usize, Request<T>)>) -> Self {
        Fanout { pending: requests }
    }

    /// The next answer (with the node's index), `None` when every node answered.
    pub(crate) async fn next(&mut self) -> Option<(usize, Result<T>)> {
        if self.pending.is_empty() {
            return None;
        }
        poll_fn(|cx| self.poll_one(cx)).await
    }

    fn poll_one(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Option<(usize, Result<T>)>> {
        for k in 0..self.pending.len() {
            if let Poll::Ready(reply) = self.pending[k].1.as_mut().poll(cx) {
                let (i, _) = self.pending.swap_remove(k);
                return Poll::Ready(Some((i, reply)));
            }
        }
        Poll::Pending
    }

    /// Every answer, in the order they arrived.
    pub(crate) async fn all(mut self) -> Vec<(usize, Result<T>)> {
        let mut answers = Vec::with_capacity(self.pending.len());
        while let Some(answer) = self.next().await {
            answers.push(answer);
        }
        answers
    }

    /// The answers that have already arrived, without waiting.
    pub(crate) fn ready(&mut self) -> Vec<(usize, Result<T>)> {
        let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
        let mut ready = Vec::new();
        while let Poll::Ready(Some(reply)) = self.poll_one(&mut cx) {
            ready.push(reply);
        }
        ready
    }

    /// Lets the requests still in flight finish on the runtime, feeding each answer to
    /// `done` (a no-op outside a tokio runtime: the requests were sent already).
    pub(crate) fn finish_in_background<F>(mut self, mut done: F)
    where
        F: FnMut(usize, Result<T>) + Send + 'static,
    {
        if self.pending.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                while let Some((i, reply)) = self.next().await {
                    done(i, reply);
                }
            });
        }
    }
}
