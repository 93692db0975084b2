//! Leader election on a name: [`Election`], its [`Leadership`] handle and the
//! [`LeaderWatch`] observers follow.
//!
//! A leadership is a lock on the election's name with a published value: campaigning waits
//! as [`Locker::acquire`] does, the term is the grant's fence, and renewal, `lost()`,
//! release on drop and [`Locker::shutdown`] are the lock's. The backend adds the value and
//! the notices observers wake on ([`LeaderValues`]).

use std::time::{Duration, Instant};

use crate::election::{check_value, Leader, LeaderValues};
use crate::error::{Error, Result};
use crate::locker::{validate_key, LockGuard, Locker};
use crate::notices::ReleaseListener;
use crate::options::{LockOptions, WaitStrategy};
use crate::permits::Permits;

/// How long an observer waits for a notice before reading the leader again anyway: notices
/// are at most once on some servers (Redis pub/sub drops what a reconnect misses).
const OBSERVE_REREAD: Duration = Duration::from_secs(30);

/// Slack added to a leader's expiry before an observer reads again, so that the read comes
/// after the server dropped the leadership.
const EXPIRY_SLACK: Duration = Duration::from_millis(20);

/// An election on a name, over a Locker whose backend publishes leaders' values.
///
/// The leader of the election `name` holds the lock `name` (so `distlock status name` shows
/// it); each leader's term is its grant's fence, strictly greater than every earlier term of
/// the name, which followers and resources can check writes against.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::LockOptions;
///
/// let election = locker.election("billing/leader")?;
/// let leadership = election
///     .campaign("10.0.0.7:8080", &LockOptions::new().ttl(Duration::from_secs(10)).wait_forever())
///     .await?;
/// println!("leading in term {}", leadership.term());
/// # async fn lead(term: u64) {}
/// tokio::select! {
///     _ = leadership.lost() => eprintln!("leadership lost: stop acting as leader"),
///     _ = lead(leadership.term()) => leadership.resign().await?,
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    locker: Locker,
    name: String,
}

impl Locker {
    /// The election on `name` (a lock key: the leader holds the lock `name`).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for an invalid name; [`Error::Unsupported`] when the backend
    /// publishes no leaders' values (Redlock).
    pub fn election(&self, name: &str) -> Result<Election> {
        validate_key(name)?;
        if self.inner.proto().leader_values().is_none() {
            return Err(Error::Unsupported {
                backend: self.inner.caps.name,
                operation: "leader election",
            });
        }
        Ok(Election {
            locker: self.clone(),
            name: name.to_owned(),
        })
    }
}

impl Election {
    /// The election's name (the key its leader holds).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn values(&self) -> &dyn LeaderValues {
        // Checked by `Locker::election`, and a backend's abilities do not change.
        self.locker
            .inner
            .proto()
            .leader_values()
            .expect("an election's backend publishes leaders' values")
    }

    /// Waits until this candidate leads, then publishes `value` and returns the leadership.
    ///
    /// Waiting follows `opts` as [`Locker::acquire`] does (TTL, wait strategy, watchdog);
    /// its permits are ignored: a leadership is a lock. Candidates of one Locker queue in
    /// arrival order, and a resigning leader hands over to the next without waiting for its
    /// TTL.
    ///
    /// # Errors
    /// As [`Locker::acquire`]; [`Error::InvalidKey`] for a value over
    /// [`MAX_LEADER_VALUE`](crate::election::MAX_LEADER_VALUE) bytes; the error of the
    /// publication (the leadership is then released). A grant that expires before its value
    /// is published (the server or this process paused past the TTL) made nobody leader:
    /// the campaign goes on within the wait strategy's time ([`Error::Locked`] with `skip`,
    /// [`Error::Timeout`] when the time is up).
    ///
    /// # Cancel safety
    /// As [`Locker::acquire`]: a dropped campaign leaves no leadership behind (a grant made
    /// meanwhile is released in the background).
    pub async fn campaign(
        &self,
        value: impl Into<Vec<u8>>,
        opts: &LockOptions,
    ) -> Result<Leadership> {
        let value = value.into();
        check_value(&self.name, &value)?;
        let mut opts = opts.clone().permits(Permits::LOCK);
        opts.announce = true;
        let limit = match opts.wait {
            WaitStrategy::Wait(limit) => Some(limit),
            WaitStrategy::Skip | WaitStrategy::WaitForever => None,
        };
        let deadline = limit.and_then(|limit| Instant::now().checked_add(limit));
        loop {
            let guard = self.locker.acquire(self.name.as_str(), &opts).await?;
            // Dropped on an error (or a cancelled publication): released in the background.
            match self.values().publish(&guard.lease(), &value).await {
                Ok(()) => {
                    return Ok(Leadership {
                        guard,
                        election: self.clone(),
                        value,
                    })
                }
                // The grant expired before its value was published (the server paused, the
                // process descheduled past the TTL): nobody was told it leads, so the
                // campaign goes on, in the time left to it.
                // With `skip`, that one attempt is over: the key is refused as taken.
                Err(Error::NotHeld { .. }) => {
                    drop(guard);
                    let key = self.name.clone();
                    if matches!(opts.wait, WaitStrategy::Skip) {
                        return Err(Error::Locked { key });
                    }
                    if let (Some(deadline), Some(waited)) = (deadline, limit) {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return Err(Error::Timeout { key, waited });
                        }
                        opts = opts.wait_for(left);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The current leader, as the server sees it; `None` when nobody leads (or the holder
    /// has not published its value yet).
    ///
    /// # Errors
    /// Transient backend errors.
    ///
    /// # Cancel safety
    /// A read only: dropping the future changes nothing.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        self.values().leader(&self.name).await
    }

    /// Follows the election's leadership changes, for processes that never campaign: each
    /// [`LeaderWatch::changed`] answers the next leader (or vacancy) that differs from the
    /// last one answered. It wakes on the server's notices (publications, resignations,
    /// releases), and at the current leader's expiry when no notice comes.
    pub fn observe(&self) -> LeaderWatch {
        LeaderWatch {
            election: self.clone(),
            last: None,
            highest: None,
            started: false,
        }
    }
}

/// This candidate's leadership of an election: a lock on the election's name with a
/// published value.
///
/// It is renewed by the watchdog when the campaign's options have it on, and ends as a
/// [`LockGuard`] does: [`resign`](Self::resign), drop (released in the background), the
/// Locker's [`shutdown`](Locker::shutdown), or loss ([`lost`](Self::lost)). Every end by
/// release is announced to the election's observers in every process.
#[must_use = "dropping the leadership resigns at once"]
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    election: Election,
    value: Vec<u8>,
}

impl Leadership {
    /// The election's name.
    pub fn name(&self) -> &str {
        self.election.name()
    }

    /// This leadership's term: the fence of its grant, strictly greater than every earlier
    /// leader's of the election. Pass it with every write a leader makes, so a resource can
    /// refuse the writes of a superseded leader.
    pub fn term(&self) -> u64 {
        self.guard.fence()
    }

    /// The value this leader last published.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// Whether the leadership is known lost (as [`LockGuard::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// A future that resolves as soon as the leadership is known lost (as
    /// [`LockGuard::lost`]); stop acting as the leader then.
    ///
    /// # Cancel safety
    /// Dropping the future has no effect on the leadership.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// The lock the leadership is made of.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Publishes `value` as this leader's value, keeping the leadership, and wakes the
    /// observers.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a value too long; [`Error::NotHeld`] when the leadership
    /// was lost (nothing is published); transient backend errors (the value may or may not
    /// have been published; the leadership goes on).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the value published or not; the leadership goes on.
    pub async fn proclaim(&mut self, value: impl Into<Vec<u8>>) -> Result<()> {
        let value = value.into();
        check_value(self.name(), &value)?;
        if self.guard.is_lost() {
            return Err(Error::NotHeld {
                key: self.name().to_owned(),
            });
        }
        self.election
            .values()
            .publish(&self.guard.lease(), &value)
            .await?;
        self.value = value;
        Ok(())
    }

    /// Resigns: releases the leadership at once (handed to the next candidate of this
    /// Locker when the backend can) and announces it to the observers, so the next
    /// candidate does not wait for the TTL.
    ///
    /// # Errors
    /// As [`LockGuard::release`]: [`Error::NotHeld`] when the leadership was already lost.
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`]: a dropped future finishes the release in the background.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }

    /// The lock the leadership is made of, ending the leadership when it ends.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }
}

/// Follows an election's leadership ([`Election::observe`]).
#[derive(Debug)]
pub struct LeaderWatch {
    election: Election,
    last: Option<Leader>,
    /// The highest term answered so far, kept across answers of "nobody leads": a record
    /// a server brings back (a restart from an older snapshot, a lagging member) is never
    /// answered after a later term.
    highest: Option<u64>,
    started: bool,
}

impl LeaderWatch {
    /// The leader last answered (`None` before the first answer or while nobody leads).
    pub fn current(&self) -> Option<&Leader> {
        self.last.as_ref()
    }

    /// Waits for the next change of leadership and answers it: the first call answers the
    /// current state at once; each later call answers the first state that differs from
    /// the last answered (a new term, a new value, or `None` when nobody leads). Changes
    /// that come and go between two reads are not seen, but terms answered always increase.
    ///
    /// # Errors
    /// Transient backend errors; the watch can be called again.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call loses no change (the next call compares with the last
    /// state answered).
    pub async fn changed(&mut self) -> Result<Option<Leader>> {
        let values = self.election.values();
        let key = self.election.name.as_str();
        loop {
            // Listening before the read: a notice between the read and the wait is kept.
            let listener: Option<ReleaseListener> = self.election.locker.inner.proto().listen(key);
            let now = values.leader(key).await?;
            let changed = match (&self.last, &now) {
                _ if !self.started => true,
                (Some(a), Some(b)) => !a.same_as(b),
                (None, None) => false,
                _ => true,
            };
            // Terms only grow: a read that lags behind one already answered (another
            // server's view, a record restored from an older snapshot) is not a change,
            // whatever was answered in between.
            let stale = matches!((self.highest, &now), (Some(a), Some(b)) if b.term < a);
            if changed && !stale {
                self.started = true;
                if let Some(leader) = &now {
                    self.highest = Some(self.highest.map_or(leader.term, |t| t.max(leader.term)));
                }
                self.last = now.clone();
                return Ok(now);
            }
            let wait = now
                .as_ref()
                .and_then(|l| l.expires_in)
                .map_or(OBSERVE_REREAD, |left| {
                    (left + EXPIRY_SLACK).min(OBSERVE_REREAD)
                });
            match listener {
                Some(mut listener) => {
                    let _ = tokio::time::timeout(wait, listener.released()).await;
                }
                None => tokio::time::sleep(wait).await,
            }
        }
    }
}
