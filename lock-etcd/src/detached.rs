//! Operations that may grant a lock are never cut off half-way: an etcd transaction cannot
//! be recalled once sent (etcd may apply it after a release sent meanwhile). One runs in
//! place while its caller waits for it, and on a task of its own once the caller gives up;
//! [`Backend::abandon`](lock_core::Backend::abandon) waits for it
//! ([`Running::settled`](crate::running::Running::settled)) before it releases what it
//! granted, so lock-core's clean-up of a cancelled attempt is the only one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use lock_core::{Attempt, Error, Owner, Result};
use tokio::sync::watch;

use crate::error::NAME;
use crate::shared::Shared;

/// Runs `op`, an operation that may grant a key to `owner`, and returns its answer.
/// Dropping the returned future leaves the operation running on a task of its own; the
/// caller then abandons `owner`, which waits for it.
pub(crate) async fn detached<F, Fut>(shared: &Arc<Shared>, owner: Owner, op: F) -> Result<Attempt>
where
    F: FnOnce(Arc<Shared>) -> Fut,
    Fut: Future<Output = Result<Attempt>> + Send + 'static,
{
    let (member, _) = shared.members.pick();
    let (finished, done) = watch::channel(false);
    shared.running.insert(owner, done);
    let mut run = Detached {
        op: Some(Box::pin(op(shared.clone()))),
        shared: shared.clone(),
        owner,
        finished: Some(finished),
    };
    let result = std::future::poll_fn(|cx| run.poll_op(cx)).await;
    shared.members.note(member, result)
}

/// An operation run in place by [`detached`]; finished on a task of its own when dropped
/// before it completed. Either way its entry in [`Running`](crate::running::Running) goes
/// once it finished.
struct Detached {
    op: Option<Pin<Box<dyn Future<Output = Result<Attempt>> + Send>>>,
    shared: Arc<Shared>,
    owner: Owner,
    /// Told once the operation finished.
    finished: Option<watch::Sender<bool>>,
}

impl Detached {
    fn poll_op(&mut self, cx: &mut Context<'_>) -> Poll<Result<Attempt>> {
        let Some(op) = self.op.as_mut() else {
            return Poll::Ready(Err(Error::backend(NAME, "polled after completion")));
        };
        let result = std::task::ready!(op.as_mut().poll(cx));
        self.op = None;
        finish(&self.shared, self.owner, self.finished.take());
        Poll::Ready(result)
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        let Some(op) = self.op.take() else { return };
        let (shared, owner, finished) = (self.shared.clone(), self.owner, self.finished.take());
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = op.await;
                    finish(&shared, owner, finished);
                });
            }
            // No runtime to finish on: a grant it may still get expires at its TTL.
            Err(_) => finish(&shared, owner, finished),
        }
    }
}

/// The operation of `owner` is over: `abandon` may release what it granted.
fn finish(shared: &Shared, owner: Owner, finished: Option<watch::Sender<bool>>) {
    shared.running.remove(owner);
    if let Some(finished) = finished {
        let _ = finished.send(true);
    }
}
