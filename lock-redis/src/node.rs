//! One Redis server: the single-node lock protocol, `RedisNode`'s lock operations (the
//! handle itself, its connection and how a request is sent are in `handle.rs`).

use std::time::{Duration, Instant};

use lock_core::{Attempt, Capabilities, Error, Holder, Owner, Permits, Result, Ttl};
use redis::Value;

use crate::codec::{hex, millis};
use crate::error::{Failure, NAME};
use crate::handle::RedisNode;
use crate::ops::{mismatched, AcquireOp, HandOverOp, Op, Out, Queued, ReleaseOp};
use crate::scripts;

/// What the Redis backend promises (see the crate documentation).
pub const CAPABILITIES: Capabilities = Capabilities::new(NAME)
    .min_ttl(Duration::from_millis(10))
    .ttl_granularity(Duration::from_millis(1))
    .max_ttl(Duration::from_secs(30 * 24 * 3600))
    // Fences of a key strictly increase from grant to grant on every Redis from 5.0 (the
    // fence script uses only `GET`, `SET … PX` and `TIME`), while the key's counter lives
    // and, once it is lost or stale, as long as the server clock did not go back below the
    // time of the earlier grants (see the crate documentation, "Fencing").
    .monotonic_fencing(true)
    .release_notices(true)
    .cross_process(true)
    .clock_drift(lock_core::ClockDrift::NONE)
    // Semaphores and reader-writer keys: one script per operation, as for locks (see
    // `permits.rs`).
    .max_permits(lock_core::MAX_PERMITS);

/// How long a fence counter lives beyond the TTL of the grant (or the Redlock write-back)
/// that last wrote it. While it lives, fences of the key increase whatever the server clock
/// does; afterwards the server clock orders them (see the crate documentation).
pub const FENCE_RETENTION: Duration = Duration::from_secs(600);

/// The tombstone of an abandoned attempt (`RedisNode::abandon`) lives this many times
/// the operation timeout of the handle that abandons it (see
/// [`abandon_retention`](RedisNode::abandon_retention)): 30 s with the default 1 s timeout.
pub const ABANDON_TIMEOUTS: u32 = 30;

/// The shortest a tombstone lives, whatever the timeout.
pub const MIN_ABANDON_RETENTION: Duration = Duration::from_secs(1);

/// The longest a tombstone lives, whatever the timeout.
pub const ABANDON_RETENTION: Duration = Duration::from_secs(600);

/// The largest fence this protocol handles: Lua numbers are doubles, exact up to 2^53.
pub const MAX_FENCE: u64 = 1 << 53;

impl RedisNode {
    /// One attempt to take lock `name` for `owner` for `ttl` (a [`Ttl`] of [`CAPABILITIES`],
    /// or of a backend whose TTL rules are at least as strict, as Redlock's are). Granted: the fencing token and a `valid_until` computed from the instant before
    /// the request was sent. Taken: the holder's remaining time (`None` when the key has no
    /// expiry, i.e. it was written by something other than this protocol).
    ///
    /// Asking again with the owner that already holds the lock grants it again with the
    /// same fence and a fresh TTL.
    ///
    /// A grant's fence is `max(counter + 1, server TIME in µs rounded down to the ms)`, written back to the
    /// key's counter. Fences of a key strictly increase from grant to grant while the
    /// counter lives, and otherwise (counter expired, lost, or restored STALE by an RDB
    /// snapshot, AOF `everysec` or an async replica) as long as the server clock did not
    /// go back below the time of the previous grants (see the crate documentation).
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub async fn try_acquire(&self, name: &str, owner: Owner, ttl: Ttl) -> Result<Attempt> {
        let ttl_ms = ttl.as_millis();
        let started = Instant::now();
        let lock_key = self.lock_key(name);
        let op = AcquireOp {
            fence_key: self.fence_key(name),
            tombstone: self.tombstone_key(name, owner),
            holders: self.holders_key(name),
            owner: hex(owner),
            ttl_ms,
            retention: ttl_ms + millis(FENCE_RETENTION),
            timeout: self.timeout,
        };
        let reply = match self.grouped("acquire", lock_key, Op::Acquire(op)).await? {
            Out::Acquire(flag, value) => (flag, value),
            Out::Refused(message) => return Err(self.failure("acquire", Failure::Refused(message))),
            Out::Release(_) => return Err(self.failure("acquire", mismatched())),
        };
        self.attempt_reply("acquire", name, Permits::LOCK, started + ttl.get(), reply)
    }

    /// Passes lock `name` from `from` straight to `to` for `ttl`, with a new fence, if
    /// `from` still holds it: one script, the key never free in between. `Taken` when
    /// `from` no longer holds it (nothing changes then).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn hand_over(&self, name: &str, from: Owner, to: Owner, ttl: Ttl) -> Result<Attempt> {
        let ttl_ms = ttl.as_millis();
        let started = Instant::now();
        let op = HandOverOp {
            fence_key: self.fence_key(name),
            tombstone: self.tombstone_key(name, to),
            from: hex(from),
            to: hex(to),
            ttl_ms,
            retention: ttl_ms + millis(FENCE_RETENTION),
            timeout: self.timeout,
        };
        let reply = match self
            .grouped("hand_over", self.lock_key(name), Op::HandOver(op))
            .await?
        {
            Out::Acquire(flag, value) => (flag, value),
            Out::Refused(message) => {
                return Err(self.failure("hand_over", Failure::Refused(message)))
            }
            Out::Release(_) => return Err(self.failure("hand_over", mismatched())),
        };
        self.attempt_reply("hand_over", name, Permits::LOCK, started + ttl.get(), reply)
    }

    /// The attempt a `{flag, value}` reply of [`scripts::ACQUIRE`], [`scripts::HAND_OVER`]
    /// or [`scripts::permits::ACQUIRE_PERMITS`] tells of a `claim` on `name`.
    pub(crate) fn attempt_reply(
        &self,
        op: &'static str,
        name: &str,
        claim: Permits,
        valid_until: Instant,
        reply: (i64, i64),
    ) -> Result<Attempt> {
        match reply {
            // Held as the other kind, or with another number of permits.
            (-2, held) => Err(Error::InvalidPermits {
                reason: match held {
                    0 => format!(
                        "key {name:?} is held with several permits (a semaphore or a \
                         reader-writer key), not as a lock"
                    ),
                    1 => format!(
                        "key {name:?} is held as a lock, not with {} permits",
                        claim.of()
                    ),
                    of => format!("key {name:?} is held with {of} permits, not {}", claim.of()),
                },
            }),
            (1, fence) if fence > 0 => Ok(Attempt::Granted {
                fence: fence as u64,
                valid_until,
            }),
            (0, pttl) => Ok(Attempt::Taken {
                expires_in: match pttl {
                    // Redis rounds PTTL down: wake a millisecond later rather than too early.
                    0.. => Some(Duration::from_millis(pttl as u64 + 1)),
                    -2 => Some(Duration::ZERO),
                    _ => None,
                },
            }),
            (flag, value) => Err(self.failure(
                op,
                Failure::Reply(format!("unexpected reply {{{flag}, {value}}}")),
            )),
        }
    }

    /// Pushes the expiry of lock `name` to `ttl` from now if `owner` still holds it:
    /// `Some(valid_until)` (from the instant before the request), `None` when not held.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn extend(&self, name: &str, owner: Owner, ttl: Ttl) -> Result<Option<Instant>> {
        let ttl_ms = ttl.as_millis();
        let started = Instant::now();
        let lock_key = self.lock_key(name);
        let owner = hex(owner);
        let reply = self
            .eval(&scripts::EXTEND, "extend", |cmd| {
                cmd.arg(1).arg(&lock_key).arg(&owner[..]).arg(ttl_ms);
            })
            .await?;
        match reply {
            Value::Int(1) => Ok(Some(started + ttl.get())),
            Value::Int(0) => Ok(None),
            other => Err(self.unexpected("extend", &other)),
        }
    }

    /// Deletes lock `name` if `owner` still holds it, announcing the release on the
    /// channel; `true` when deleted, `false` when it was not held by `owner` (then nothing
    /// changes and nothing is announced).
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub async fn release(&self, name: &str, owner: Owner) -> Result<bool> {
        self.release_queued(name, owner, None).await
    }

    /// [`release`](Self::release), calling `queued` as soon as the request is queued on
    /// the shared connection (and again if it had to be re-sent). A request queued after
    /// it on this node runs after it on the server, so a local waiter woken by `queued`
    /// can attempt at once, saving a round trip on every hand-off; if that attempt comes
    /// too early (the release fails), it is only refused.
    pub(crate) async fn release_queued(
        &self,
        name: &str,
        owner: Owner,
        queued: Option<Queued>,
    ) -> Result<bool> {
        let lock_key = self.lock_key(name);
        let op = ReleaseOp {
            owner: hex(owner),
            notice: self.notice(name),
            queued,
            timeout: self.timeout,
        };
        match self.grouped("release", lock_key, Op::Release(op)).await? {
            Out::Release(flag) => self.flag("release", Value::Int(flag)),
            Out::Refused(message) => Err(self.failure("release", Failure::Refused(message))),
            Out::Acquire(..) => Err(self.failure("release", mismatched())),
        }
    }

    /// Forgets `owner`'s attempt on key `name` whose answer never came (it timed out, or
    /// its caller gave up): writes the attempt's tombstone ([`tombstone_key`], kept for
    /// [`abandon_retention`](Self::abandon_retention)), so that its request, if it reaches
    /// the server later (it may sit in the socket buffer of a discarded connection while
    /// this goes on a new one), is answered "taken" and grants nothing; and deletes the lock,
    /// or gives back the permits, (announcing the release) if the attempt was granted
    /// already, whichever kind it claimed. `true` when a grant was removed.
    ///
    /// One script, sent at once (not behind queued requests): order does not matter, the
    /// tombstone covers an attempt that arrives after it.
    ///
    /// Abandon through a handle whose timeout is at least the attempt's (the node's own, or
    /// a longer [`with_timeout`](Self::with_timeout)): the retention counts in it.
    ///
    /// Cancellation: dropping the future after the request went out does not recall it;
    /// before, nothing is written, and the attempt may still grant (until its TTL).
    ///
    /// [`tombstone_key`]: Self::tombstone_key
    ///
    /// # Errors
    /// As [`ping`](Self::ping); an error means the tombstone may not be written.
    pub async fn abandon(&self, name: &str, owner: Owner) -> Result<bool> {
        let lock_key = self.lock_key(name);
        let tombstone = self.tombstone_key(name, owner);
        let (holders, permits) = (self.holders_key(name), self.permits_key(name));
        let notice = self.notice(name);
        let owner = hex(owner);
        let reply = self
            .eval(&scripts::ABANDON, "abandon", |cmd| {
                cmd.arg(4)
                    .arg(&lock_key)
                    .arg(&tombstone)
                    .arg(&holders)
                    .arg(&permits)
                    .arg(&owner[..])
                    .arg(self.release_channel())
                    .arg(&notice)
                    .arg(millis(self.abandon_retention()));
            })
            .await?;
        self.flag("abandon", reply)
    }

    /// How long a tombstone written through this handle lives: `ABANDON_TIMEOUTS` times
    /// its [`timeout`](Self::timeout), between `MIN_ABANDON_RETENTION` and
    /// `ABANDON_RETENTION` (30 s with the default 1 s timeout).
    ///
    /// The rule: a tombstone is kept while the abandoned request can still arrive, and
    /// what a request arriving later can do is bounded anyway. The request was sent at
    /// most one timeout before its abandon (an attempt is abandoned when its timeout
    /// fires, or sooner when its caller gives up), and it is either
    /// - on a connection that still delivers in order (the caller gave up early): the
    ///   server reads it before the abandon sent behind it, or, when that connection was
    ///   replaced meanwhile, as soon as the server reads the old one, moments later; or
    /// - on a connection discarded because a request on it timed out: its bytes arrive
    ///   only once the server or the path that stalled for a whole timeout resumes.
    ///
    /// A server that stayed silent for `ABANDON_TIMEOUTS` timeouts has been down, by
    /// the client's own measure, that many times over; a request of it arriving even
    /// later can grant, but only a lock that holds the key for the attempt's TTL and never
    /// counts for anyone (its owner gave up), the same as a crash of that owner. So the
    /// retention scales with the timeout instead of being a fixed long time: a service
    /// cancelling 1,000 attempts a second keeps about 30,000 tombstones (some 5 MB) with
    /// the default timeout, not the 600,000 of a fixed 10 minutes.
    pub fn abandon_retention(&self) -> Duration {
        (self.timeout * ABANDON_TIMEOUTS).clamp(MIN_ABANDON_RETENTION, ABANDON_RETENTION)
    }

    /// Deletes lock `name` whoever holds it, and every holder of its permits, and
    /// announces the release; `true` when a lock or permits were there. The fence counter
    /// is kept, so later fences still increase.
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        let lock_key = self.lock_key(name);
        let (holders, permits) = (self.holders_key(name), self.permits_key(name));
        let notice = self.notice(name);
        let reply = self
            .eval(&scripts::FORCE_RELEASE, "force_release", |cmd| {
                cmd.arg(3)
                    .arg(&lock_key)
                    .arg(&holders)
                    .arg(&permits)
                    .arg(self.release_channel())
                    .arg(&notice);
            })
            .await?;
        self.flag("force_release", reply)
    }

    /// The holder of lock `name`, `None` when free: its owner token (when the value is one),
    /// the key's fence counter (the holder's fence when the lock was taken through this
    /// protocol) and its remaining time (`None` without expiry).
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub async fn inspect(&self, name: &str) -> Result<Option<Holder>> {
        let (lock_key, fence_key) = (self.lock_key(name), self.fence_key(name));
        let reply = self
            .eval(&scripts::INSPECT, "inspect", |cmd| {
                cmd.arg(2).arg(&lock_key).arg(&fence_key);
            })
            .await?;
        match &reply {
            Value::Nil | Value::Boolean(false) => Ok(None),
            Value::Array(items) => match items.as_slice() {
                [Value::BulkString(owner), Value::Int(pttl), Value::BulkString(fence)] => {
                    Ok(Some(Holder::new(
                        std::str::from_utf8(owner).ok().and_then(Owner::parse),
                        std::str::from_utf8(fence).ok().and_then(|f| f.parse().ok()),
                        u64::try_from(*pttl).ok().map(Duration::from_millis),
                    )))
                }
                _ => Err(self.unexpected("inspect", &reply)),
            },
            _ => Err(self.unexpected("inspect", &reply)),
        }
    }

    /// Raises the fence counter of lock `name` to at least `fence` (then keeping it for
    /// `ttl` plus `FENCE_RETENTION`); `true` when raised, `false` when it was already at least
    /// `fence`. Redlock writes a grant's winning fence back to a majority with it, so that
    /// every later majority issues a greater one.
    ///
    /// # Errors
    /// [`Error::Backend`](lock_core::Error::Backend) for a fence above `MAX_FENCE`;
    /// otherwise as [`ping`](Self::ping).
    pub async fn raise_fence(&self, name: &str, fence: u64, ttl: Ttl) -> Result<bool> {
        if fence > MAX_FENCE {
            return Err(self.failure(
                "raise_fence",
                Failure::Reply(format!("fence {fence} is above the maximum {MAX_FENCE}")),
            ));
        }
        let fence_key = self.fence_key(name);
        let retention = ttl.as_millis() + millis(FENCE_RETENTION);
        let reply = self
            .eval(&scripts::RAISE_FENCE, "raise_fence", |cmd| {
                cmd.arg(1).arg(&fence_key).arg(fence).arg(retention);
            })
            .await?;
        self.flag("raise_fence", reply)
    }
}
