//! The hand-over protocol, whole: a key passes from a guard's release straight to the head
//! waiter of the same Locker in one server step ([`HandOver`](crate::HandOver)).
//!
//! - The head waiter, finding live local holders that make its attempt certain to be
//!   refused, registers a request (a fresh owner token, its claim and its TTL) on the
//!   key's queue entry and waits ([`wait_behind`]).
//! - The release of one of those holders, once its own renewals have stopped, takes the
//!   request if the waiter claims what it holds ([`take`]) and sends one hand-over in place
//!   of the release ([`give`]); the server passes the grant only while it still holds it
//!   for the holder.
//! - The waiter receives the new lease (or, when the hand-over did not happen, nothing)
//!   and checks its validity before returning it; an expired one is released.
//!
//! Nothing changes hands while the holder still holds, and a key is handed over at most
//! [`MAX_HAND_OVERS`] times in a row.

use futures::FutureExt as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::deadline::{sleep_until_deadline, within};
use super::queue::{HandOverRequest, LocalHolder, QueueEntry};
use super::shared::Shared;
use crate::backend::Attempt;
use crate::capabilities::Ttl;
use crate::error::{Error, Result};
use crate::lease::{Lease, Owner};
use crate::notices::ReleaseListener;
use crate::permits::Permits;
use crate::sync::lock;

/// Hand-overs of one key in a row inside a Locker, after which its holder releases it on
/// the server instead: waiters in other processes, woken by that release, then get their
/// chance at it.
pub(crate) const MAX_HAND_OVERS: u32 = 16;

/// How the head waiter's wait behind its sibling holders ended.
pub(crate) enum Woken {
    /// A holder handed its grant over (`Some`), or answered that it did not (`None`).
    HandedOver(Option<Lease>),
    /// One of the holders' guards ended (released, lost or expired).
    Ended,
    /// A release notice for the key.
    Notice,
    /// The waiter's deadline passed.
    Deadline,
}

/// Waits behind `holders`, the live local guards of the key of `entry` that make an attempt
/// for `permits` certain to be refused (one, for a lock): until one of them hands its
/// grant over (when the backend can), any of them ends, a release notice comes, or the
/// deadline passes. A request a holder took is waited for to its answer.
pub(crate) async fn wait_behind(
    shared: &Shared,
    entry: &QueueEntry,
    holders: Vec<Arc<dyn LocalHolder>>,
    (permits, ttl): (Permits, Ttl),
    listener: &mut Option<ReleaseListener>,
    deadline: Option<Instant>,
) -> Woken {
    let mut request = shared
        .proto()
        .hand_over()
        .map(|_| HandOverWait::register(entry, permits, ttl));
    let handed = async {
        match request.as_mut() {
            Some(h) => (&mut h.reply).await.ok(),
            None => std::future::pending().await,
        }
    };
    let ended = async {
        if holders.is_empty() {
            return std::future::pending().await;
        }
        futures::future::select_all(holders.into_iter().map(|h| h.ended())).await;
    };
    let released = async {
        match listener.as_mut() {
            Some(l) => l.released().await,
            None => std::future::pending().await,
        }
    };
    let woken = futures::select_biased! {
        lease = handed.fuse() => Woken::HandedOver(lease),
        _ = ended.fuse() => Woken::Ended,
        _ = released.fuse() => Woken::Notice,
        _ = sleep_until_deadline(deadline).fuse() => Woken::Deadline,
    };
    match (woken, request) {
        // A holder took the request: its answer (a lease, or none when the hand-over did
        // not happen) is on its way.
        (Woken::Ended | Woken::Notice, Some(mut h)) if !h.withdraw() => {
            match within(deadline, &mut h.reply).await {
                Some(lease) => Woken::HandedOver(lease.ok()),
                None => Woken::Deadline,
            }
        }
        (woken, _) => woken,
    }
}

/// Takes the request of the head waiter queued behind `holder` on `key`, when `holder` is
/// one of the key's recorded local holders, the waiter claims the same permits, the backend
/// hands keys over and the key may be handed over once more (not after shutdown, and not
/// more than [`MAX_HAND_OVERS`] times in a row). Called by the holder's release only, once
/// its own renewals have stopped.
pub(crate) fn take(
    shared: &Shared,
    holder: &dyn LocalHolder,
    key: &str,
) -> Option<HandOverRequest> {
    if shared.proto().hand_over().is_none() || shared.is_shut_down() {
        return None;
    }
    shared.queues.with_entry(key, |entry| {
        if !entry.is_holder(holder) || entry.handed.load(Ordering::SeqCst) >= MAX_HAND_OVERS {
            return None;
        }
        let mut slot = lock(&entry.hand_over);
        // A grant passes only as it is: to a waiter claiming the same permits.
        if slot.as_ref()?.permits != holder.permits() {
            return None;
        }
        let request = slot.take()?;
        entry.handed.fetch_add(1, Ordering::SeqCst);
        Some(request)
    })?
}

/// Passes the key of `lease` straight to the waiter of `request`, in place of the release.
///
/// - `None`: it did not happen and the lock is still to be released;
/// - `Some(Ok(()))`: the waiter holds the key now (or, if it gave up meanwhile, its grant
///   is released in the background);
/// - `Some(Err(NotHeld))`: the server no longer held the key for `lease`;
/// - `Some(Err(e))`: it may or may not have happened; what the waiter may have been
///   granted is abandoned in the background.
///
/// Cancel safety: dropped half-way, the hand-over may still happen; what the waiter may
/// have been granted is then abandoned in the background.
pub(crate) async fn give(
    shared: &Shared,
    lease: &Lease,
    request: &mut HandOverRequest,
) -> Option<Result<()>> {
    let protocol = shared.proto().hand_over()?;
    let mut cleanup = shared.arm_cleanup(lease.key_arc(), request.owner);
    let answer = protocol.hand_over(lease, request.owner, request.ttl).await;
    match answer {
        Ok(Attempt::Granted { fence, valid_until }) => {
            cleanup.disarm();
            let next = Lease::new(lease.key_arc().clone(), request.owner, fence, valid_until)
                .with_permits(lease.permits());
            let reply = request.reply.take().map(|reply| reply.send(next));
            if let Some(Err(next)) = reply {
                // The waiter gave up meanwhile: nobody holds the grant.
                shared.cleanup_in_background(next);
            }
            Some(Ok(()))
        }
        Ok(Attempt::Taken { .. }) => {
            cleanup.disarm();
            Some(Err(lease.not_held()))
        }
        Err(Error::Unsupported { .. }) => {
            cleanup.disarm();
            None
        }
        Err(e) => {
            // It may have happened: the clean-up abandons what the waiter may have been
            // granted.
            tracing::debug!(key = lease.key(), error = %e.report(), "hand-over failed");
            Some(Err(e))
        }
    }
}

/// The head waiter's standing request to be handed the key; withdrawn when dropped unless
/// the holder took it already (whose grant, if nobody receives it, the holder releases).
struct HandOverWait<'a> {
    entry: &'a QueueEntry,
    owner: Owner,
    reply: tokio::sync::oneshot::Receiver<Lease>,
}

impl<'a> HandOverWait<'a> {
    fn register(entry: &'a QueueEntry, permits: Permits, ttl: Ttl) -> Self {
        let owner = Owner::random();
        let (tx, reply) = tokio::sync::oneshot::channel();
        *lock(&entry.hand_over) = Some(HandOverRequest {
            owner,
            permits,
            ttl,
            reply: Some(tx),
        });
        HandOverWait {
            entry,
            owner,
            reply,
        }
    }

    /// Takes the request back; false when the holder has taken it.
    fn withdraw(&self) -> bool {
        let mut slot = lock(&self.entry.hand_over);
        if slot.as_ref().is_some_and(|r| r.owner == self.owner) {
            *slot = None;
            true
        } else {
            false
        }
    }
}

impl Drop for HandOverWait<'_> {
    fn drop(&mut self) {
        self.withdraw();
    }
}
