//! Operations that may grant a lock run on a task of their own: an etcd transaction cannot
//! be recalled once sent (etcd may apply it after a release sent meanwhile), so a caller
//! who gives up half-way must not cut it off. [`Backend::abandon`](lock_core::Backend::abandon)
//! waits for such an operation to finish before it releases what it granted: lock-core's
//! clean-up of a cancelled attempt is the only one, and it sees the grant.

use std::future::Future;
use std::sync::Arc;

use lock_core::{Attempt, Error, Owner, Result};
use tokio::sync::watch;

use crate::error::NAME;
use crate::shared::Shared;

/// Runs `op`, an operation that may grant a key to `owner`, on a task of its own, and
/// returns its answer. Dropping the returned future leaves the operation running; the
/// caller then abandons `owner`, which waits for it ([`Running::settled`](crate::running::Running::settled)).
pub(crate) async fn detached<F, Fut>(shared: &Arc<Shared>, owner: Owner, op: F) -> Result<Attempt>
where
    F: FnOnce(Arc<Shared>) -> Fut,
    Fut: Future<Output = Result<Attempt>> + Send + 'static,
{
    let (member, _) = shared.members.pick();
    let (finished, done) = watch::channel(false);
    shared.running.insert(owner, done);
    let me = shared.clone();
    let op = op(shared.clone());
    let task = async move {
        let result = op.await;
        me.running.remove(owner);
        let _ = finished.send(true);
        result
    };
    let result = match tokio::runtime::Handle::try_current() {
        Ok(runtime) => runtime.spawn(task).await.unwrap_or_else(|e| {
            Err(Error::backend(
                NAME,
                format!("an attempt's task failed: {e}"),
            ))
        }),
        // Polled outside a tokio runtime: run in place.
        Err(_) => task.await,
    };
    shared.members.note(member, result)
}
