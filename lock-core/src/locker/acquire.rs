//! One acquisition: the attempts on the backend and the waiting loop between them.

use futures::FutureExt as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::deadline::{timeout_error, within};
use super::guard::LockGuard;
use super::handover::{self, Woken};
use super::observe::Event;
use super::shared::{Line, Shared, ERROR_BACKOFF};
use crate::backend::Attempt;
use crate::capabilities::Ttl;
use crate::error::{Error, Result};
use crate::lease::{Lease, Owner};
use crate::notices::ReleaseListener;
use crate::options::{Backoff, LockOptions};

/// Backoff between attempts when the backend cannot announce a release.
const WAIT_BACKOFF: (Duration, Duration) = (Duration::from_millis(2), Duration::from_millis(500));

/// A grant, or the holder's time left when the lock is taken.
pub(super) type Answer = std::result::Result<LockGuard, Option<Duration>>;

/// The slow path: take this key's local turn (FIFO), then attempt and wait until
/// granted or the deadline passes. (The acquisition's state is passed as it is, rather
/// than bundled for this one call.)
#[allow(clippy::too_many_arguments)]
pub(super) async fn queued(
    shared: &Arc<Shared>,
    shared_key: &Arc<str>,
    ttl: Ttl,
    opts: &LockOptions,
    started: Option<Instant>,
    deadline: Option<Instant>,
    announced: bool,
    line: &mut Option<Line<'_>>,
) -> Result<LockGuard> {
    let key: &str = shared_key;
    let queue = shared.queues.join(key);
    let _turn = match queue.turn.turn.try_lock() {
        Ok(turn) => turn,
        Err(_) => {
            // Behind a sibling: a place kept in the server's line while waiting here could
            // reach its head and block the sibling ahead, and the whole line with it.
            if let Some(line) = line.as_mut() {
                line.restart().await;
            }
            match within(deadline, queue.turn.turn.lock()).await {
                Some(turn) => turn,
                None => return Err(timeout_error(key, started)),
            }
        }
    };
    // The caller's wait is announced once, at the first sign the key is held.
    let mut announced = announced;
    let announce = |announced: &mut bool| {
        if !std::mem::replace(announced, true) {
            shared.observe(|| Event::Waiting { key });
        }
    };
    let mut wait_backoff = Backoff::new(WAIT_BACKOFF.0, WAIT_BACKOFF.1);
    let mut error_backoff = Backoff::new(ERROR_BACKOFF.0, ERROR_BACKOFF.1);
    let mut last_error: Option<Error> = None;
    // Set when a release notice ended the last wait: attempt then, even if the
    // sibling's release has not returned yet (a backend may announce it as soon as the
    // release is queued ahead of our attempt).
    let mut noticed = false;
    loop {
        // Listen before attempting, so a release right after a refusal is not missed.
        let mut listener = shared.proto().listen(key);
        // Siblings hold what we claim: an attempt is certain to be refused and would only
        // cost the server work, so the end of any of them (or a release notice) ends the
        // wait instead. Certain means one sibling whose claim and ours cannot be held
        // together (any sibling, for a lock), or siblings holding the key's permits between
        // them ([`QueueEntry::blocking`](super::queue::QueueEntry::blocking)); otherwise the
        // server decides. After a notice the server decides too: a release may have been
        // announced before the sibling's answer came back.
        let siblings = if noticed {
            Vec::new()
        } else {
            queue.turn.blocking(opts.permits)
        };
        if !siblings.is_empty() {
            announce(&mut announced);
            let woken = handover::wait_behind(
                shared,
                &queue.turn,
                siblings,
                (opts.permits, ttl),
                &mut listener,
                deadline,
            )
            .await;
            match woken {
                Woken::HandedOver(Some(lease)) => {
                    if shared.shut_down.load(Ordering::SeqCst) {
                        shared.cleanup_in_background(lease);
                        let e = Error::Shutdown;
                        shared.metrics.with(opts.metrics_label, |s| s.error(&e));
                        return Err(e);
                    }
                    if lease.is_expired() {
                        // Answered too late to be of use (the validity counts from
                        // before the hand-over was sent): let it go, try the server.
                        shared.cleanup_in_background(lease);
                        noticed = false;
                        continue;
                    }
                    tracing::debug!(key, fence = lease.fence(), "lock handed over");
                    let guard = LockGuard::new(shared, lease, ttl, opts, Instant::now());
                    queue.turn.add_holder(guard.downgrade());
                    return Ok(guard);
                }
                // Not handed over: the holder released it on the server meanwhile.
                Woken::HandedOver(None) | Woken::Ended => noticed = false,
                Woken::Notice => noticed = true,
                Woken::Deadline => break,
            }
            continue;
        }
        noticed = false;
        let pause = match within(deadline, attempt(shared, shared_key, ttl, opts, line)).await {
            None => break,
            Some(Ok(Ok(guard))) => {
                queue.turn.add_holder(guard.downgrade());
                queue.turn.handed.store(0, Ordering::SeqCst);
                return Ok(guard);
            }
            Some(Ok(Err(expires_in))) => {
                announce(&mut announced);
                last_error = None;
                error_backoff.reset();
                Pause {
                    expires_in,
                    backoff: wait_backoff.next_delay(),
                    listener,
                }
            }
            Some(Err(e)) if e.is_transient() => {
                tracing::debug!(key, error = %e.report(), "lock attempt failed; retrying");
                shared.observe(|| Event::Retrying { key, error: &e });
                last_error = Some(e);
                Pause {
                    expires_in: None,
                    backoff: error_backoff.next_delay(),
                    listener: None,
                }
            }
            Some(Err(e)) => return Err(e),
        };
        if within(deadline, pause.wait()).await.is_none() {
            break;
        }
    }
    Err(last_error.unwrap_or_else(|| timeout_error(key, started)))
}

/// One attempt on the backend, as the owner of `line`'s place when there is one. Taken
/// means `Ok(Err(expires_in))`; a failed attempt moves the line to a new owner.
///
/// Cancel safe: if dropped while the backend call is in flight, a background task
/// releases whatever that call may have granted.
pub(super) async fn attempt(
    shared: &Arc<Shared>,
    shared_key: &Arc<str>,
    ttl: Ttl,
    opts: &LockOptions,
    line: &mut Option<Line<'_>>,
) -> Result<Answer> {
    if let Some(answer) = attempt_now(shared, shared_key, ttl, opts) {
        return answer;
    }
    let owner = line.as_mut().map(Line::attempting);
    let answer = attempt_as(shared, shared_key, ttl, opts, owner).await;
    if let Some(line) = line {
        match &answer {
            Ok(Ok(guard)) if guard.lease().owner() == line.owner() => line.granted(),
            Ok(_) => {}
            Err(_) => line.failed(),
        }
    }
    answer
}

/// One attempt on the backend as `owner` (a new owner when `None`).
async fn attempt_as(
    shared: &Arc<Shared>,
    shared_key: &Arc<str>,
    ttl: Ttl,
    opts: &LockOptions,
    owner: Option<Owner>,
) -> Result<Answer> {
    let key: &str = shared_key;
    let owner = owner.unwrap_or_else(Owner::random);
    let mut cleanup = shared.arm_cleanup(shared_key, owner);
    let permits = opts.permits;
    let result = shared.proto().try_acquire(key, owner, permits, ttl).await;
    // A failure may come after the request reached the server (a reply lost to a
    // timeout, a paused server resuming, a script that failed half-way): the grant may
    // exist, so the clean-up stays armed and releases it.
    if result.is_ok() {
        cleanup.disarm();
    }
    drop(cleanup);
    let metrics = |e: &Error| shared.metrics.with(opts.metrics_label, |s| s.error(e));
    let answer = result.inspect_err(metrics)?;
    match answer {
        Attempt::Granted { fence, valid_until } => {
            let lease =
                Lease::new(shared_key.clone(), owner, fence, valid_until).with_permits(permits);
            if shared.shut_down.load(Ordering::SeqCst) {
                let _ = shared.proto().release(&lease).await;
                let e = Error::Shutdown;
                metrics(&e);
                return Err(e);
            }
            tracing::debug!(key, fence, backend = shared.caps.name, "lock granted");
            Ok(Ok(LockGuard::new(shared, lease, ttl, opts, Instant::now())))
        }
        Attempt::Taken { expires_in } => Ok(Err(expires_in)),
    }
}

/// One attempt answered at once by an in-process backend
/// ([`Immediate`](crate::Immediate)); `None` when the backend needs the async call. A
/// synchronous answer has no reply in flight, so nothing needs cleaning up.
pub(super) fn attempt_now(
    shared: &Arc<Shared>,
    shared_key: &Arc<str>,
    ttl: Ttl,
    opts: &LockOptions,
) -> Option<Result<Answer>> {
    let now = shared.proto().immediate()?;
    let owner = Owner::random();
    Some(
        match now.try_acquire(shared_key, owner, opts.permits, ttl) {
            Ok(Attempt::Granted { fence, valid_until }) => {
                let lease = Lease::new(shared_key.clone(), owner, fence, valid_until)
                    .with_permits(opts.permits);
                if shared.is_shut_down() {
                    let _ = now.release(&lease);
                    let e = Error::Shutdown;
                    shared.metrics.with(opts.metrics_label, |s| s.error(&e));
                    return Some(Err(e));
                }
                let key: &str = shared_key;
                tracing::debug!(key, fence, backend = shared.caps.name, "lock granted");
                // Granted at the backend's own reading of the clock: no second reading.
                let lifetime = if shared.caps.session_bound {
                    crate::Capabilities::SESSION_VALIDITY
                } else {
                    ttl.get()
                };
                let granted_at = valid_until
                    .checked_sub(lifetime)
                    .unwrap_or_else(Instant::now);
                Ok(Ok(LockGuard::new(shared, lease, ttl, opts, granted_at)))
            }
            Ok(Attempt::Taken { expires_in }) => Ok(Err(expires_in)),
            Err(e) => {
                shared.metrics.with(opts.metrics_label, |s| s.error(&e));
                Err(e)
            }
        },
    )
}

/// Everything the wait before the next attempt depends on.
struct Pause {
    /// How long the holder has left according to the refused attempt.
    expires_in: Option<Duration>,
    /// The jittered exponential backoff the Locker computed for this round.
    backoff: Duration,
    /// The release listener registered before the refused attempt, if the backend has one.
    listener: Option<ReleaseListener>,
}

impl Pause {
    /// The default wait: with a release listener, until a release notice or the holder's
    /// expiry (the backoff when the expiry is unknown); without one, the backoff cut short
    /// at the holder's expiry.
    async fn wait(mut self) {
        let timer = match (&self.listener, self.expires_in) {
            (Some(_), Some(exp)) => exp,
            (Some(_), None) => self.backoff,
            (None, Some(exp)) => self.backoff.min(exp),
            (None, None) => self.backoff,
        };
        match self.listener.as_mut() {
            Some(listener) => {
                futures::select! {
                    _ = listener.released().fuse() => {}
                    _ = tokio::time::sleep(timer).fuse() => {}
                }
            }
            None => tokio::time::sleep(timer).await,
        }
    }
}
