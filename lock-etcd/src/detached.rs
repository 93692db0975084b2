//! Operations that may grant a lock, finished on a task of their own when their caller
//! gives up half-way.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use lock_core::{Attempt, Error, Lease, Owner, Result};

use crate::error::NAME;
use crate::shared::Shared;

/// Runs `op`, an operation that may grant `key` to `owner`, in place, and finishes it on a
/// task of its own if the caller gives up mid-flight: it cannot be cut off half-way (a
/// transaction etcd may still apply after a release sent meanwhile), and a grant nobody
/// waits for any more is released there, after it happened.
pub(crate) async fn detached<F, Fut>(
    shared: &Arc<Shared>,
    key: Arc<str>,
    owner: Owner,
    op: F,
) -> Result<Attempt>
where
    F: FnOnce(Arc<Shared>) -> Fut,
    Fut: Future<Output = Result<Attempt>> + Send + 'static,
{
    let (member, _) = shared.members.pick();
    let mut run = Detached {
        op: Some(Box::pin(op(shared.clone()))),
        shared: shared.clone(),
        key,
        owner,
    };
    let result = std::future::poll_fn(|cx| run.poll_op(cx)).await;
    shared.members.note(member, result)
}

/// An operation run in place by [`detached`]; finished on a task of its own when dropped
/// before it completed.
struct Detached {
    op: Option<Pin<Box<dyn Future<Output = Result<Attempt>> + Send>>>,
    shared: Arc<Shared>,
    key: Arc<str>,
    owner: Owner,
}

impl Detached {
    fn poll_op(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<Attempt>> {
        let Some(op) = self.op.as_mut() else {
            return std::task::Poll::Ready(Err(Error::backend(NAME, "polled after completion")));
        };
        let result = std::task::ready!(op.as_mut().poll(cx));
        self.op = None;
        std::task::Poll::Ready(result)
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        let Some(op) = self.op.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to finish on: whatever it was granted expires at its TTL.
            return;
        };
        let (shared, key, owner) = (self.shared.clone(), self.key.clone(), self.owner);
        runtime.spawn(async move {
            if let Ok(Attempt::Granted { fence, valid_until }) = op.await {
                let lease = Lease::new(key, owner, fence, valid_until);
                let _ = shared.release(&lease).await;
            }
        });
    }
}
