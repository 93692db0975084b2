//! What a backend can promise ([`Capabilities`]), its clock-drift allowance
//! ([`ClockDrift`]), and the TTL that passed its rules ([`Ttl`]).

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::permits::Permits;

/// What a backend can promise; the [`Locker`](crate::Locker) and the conformance suite
/// decide behaviour from these, never from the backend's name.
///
/// `#[non_exhaustive]`: it will tell more (kinds of grant) later. A backend builds it in a
/// `const` with [`Capabilities::new`] and the setters, each named after its field, so a
/// new promise starts at its safe default for every existing backend.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Short name used in errors, logs and metrics (`memory`, `redis`, `redlock`, `etcd`).
    pub name: &'static str,
    /// The shortest TTL the server supports; shorter requests are rounded up to it.
    pub min_ttl: Duration,
    /// TTLs are rounded up to a multiple of this (etcd leases: whole seconds).
    pub ttl_granularity: Duration,
    /// The longest TTL the backend can represent; longer requests are refused.
    pub max_ttl: Duration,
    /// What bounds [`max_ttl`](Self::max_ttl) and how to raise it, appended to the refusal
    /// of a longer TTL (ZooKeeper: the session timeout, its URL parameter); empty when the
    /// maximum is fixed.
    pub max_ttl_hint: &'static str,
    /// Whether fencing tokens strictly increase across successive holders of a key (every
    /// grant's token is greater than every earlier grant's for the same key), under the
    /// conditions the backend documents; nothing is promised across different keys.
    ///
    /// What each backend promises across restarts and failovers:
    /// - memory: a counter in the process (nothing survives the process anyway).
    /// - redis: `max(counter + 1, server TIME in µs)` on every grant, so tokens increase
    ///   across restarts and failovers that lose the counter or bring back an older one
    ///   (no persistence, RDB, AOF `everysec`, an async replica promoted), unless the
    ///   server's clock goes back (behind the time of earlier grants) while the counter is
    ///   lost or stale.
    /// - redlock (with fencing on): each node's token as for redis, the largest written
    ///   back to a majority before the guard is returned; counters are kept for the TTL
    ///   plus 10 minutes, after which (or once lost) node clocks order tokens, so nodes
    ///   whose clocks disagree by more than that time can make tokens go back. `false` with
    ///   fencing off.
    /// - etcd: the revision of the granting write; the cluster's revision never goes back
    ///   (short of restoring the cluster from an older backup).
    ///
    /// `false` means tokens may repeat or go back between holders: do not use them to
    /// fence a resource.
    pub monotonic_fencing: bool,
    /// Whether the backend announces releases ([`Backend::listen`](crate::Backend::listen)), so waiters never poll.
    pub release_notices: bool,
    /// Whether the lock excludes other processes (false for the in-process backend).
    pub cross_process: bool,
    /// How much shorter than its TTL a grant's validity is (Redlock's clock-drift
    /// allowance; none elsewhere). The guard uses it to bound its validity while an
    /// extension's outcome is unknown.
    pub clock_drift: ClockDrift,
    /// The most permits a key of this backend can have ([`Permits::of`]): 1 when it keeps
    /// locks only, [`MAX_PERMITS`](crate::MAX_PERMITS) when it keeps semaphores and
    /// reader-writer locks too. The [`Locker`](crate::Locker) refuses a larger claim before
    /// any I/O, with [`permits_refusal`](Self::permits_refusal) as the reason.
    pub max_permits: u32,
    /// Why a claim of more than [`max_permits`](Self::max_permits) is refused (Redlock: the
    /// nodes' majorities overlap, so N independent nodes cannot bound the holders of k of
    /// N permits).
    pub permits_refusal: &'static str,
    /// Whether grants live as long as a session (a process, a connection, an open file)
    /// rather than a TTL: a file lock, MySQL's `GET_LOCK`, ZooKeeper's ephemeral nodes.
    ///
    /// A session-bound grant does not expire while its session lives: the TTL a caller
    /// gives passes [`effective_ttl`](Self::effective_ttl)'s rules and is then ignored,
    /// [`validity`](Self::validity) is [`SESSION_VALIDITY`](Self::SESSION_VALIDITY) from the
    /// request, the watchdog schedules no renewal (there is nothing to renew), and
    /// [`LockGuard::lost`](crate::LockGuard::lost) fires only when the backend learns that
    /// the session is gone (never, for a file lock, while the process lives). An
    /// [`extend`](crate::Backend::extend) checks that the grant is still held.
    pub session_bound: bool,
    /// Whether the server keeps the line of waiters (ZooKeeper's sequential nodes): a
    /// refused attempt leaves the owner's place in it, and the next attempt of the same
    /// owner keeps that place, so waiters in every process are granted in arrival order.
    ///
    /// The [`Locker`](crate::Locker) then makes every attempt of one acquisition with one
    /// owner (a new one after an attempt that failed, whose clean-up may still be on its
    /// way), and [abandons](crate::Backend::abandon) that owner's place when the
    /// acquisition ends without its grant: a deadline, an error, `skip`'s refusal, a
    /// hand-over from a sibling, or a cancelled call. Elsewhere every attempt has an owner
    /// of its own and a refusal leaves nothing on the server.
    pub server_queue: bool,
}

/// A lock TTL that passed a backend's rules: not zero, within its maximum, rounded up to
/// its minimum and granularity. Only [`Capabilities::effective_ttl`] makes one, so a
/// backend handed a `Ttl` needs no checks of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(Duration);

impl Ttl {
    /// The TTL as a duration.
    pub fn get(self) -> Duration {
        self.0
    }

    /// Whole milliseconds (a `Ttl` of a millisecond-granular backend is exact).
    pub fn as_millis(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whole seconds (a `Ttl` of a second-granular backend is exact).
    pub fn as_secs(self) -> u64 {
        self.0.as_secs()
    }
}

impl From<Ttl> for Duration {
    fn from(ttl: Ttl) -> Duration {
        ttl.0
    }
}

/// The part of a TTL a backend sets aside for clock drift: `ttl × per_million / 10⁶ +
/// fixed`. A grant or renewal of `ttl` sent at `t` is valid until at least
/// `t + ttl − allowance(ttl)` once the server applied it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClockDrift {
    /// The drift factor in parts per million of the TTL (rounded up).
    pub per_million: u32,
    /// A fixed allowance on top (expiry precision of the servers).
    pub fixed: Duration,
}

impl ClockDrift {
    /// No allowance: the validity is the TTL from before the request.
    pub const NONE: ClockDrift = ClockDrift {
        per_million: 0,
        fixed: Duration::ZERO,
    };

    /// The allowance `ttl × per_million / 10⁶ + fixed`.
    pub const fn new(per_million: u32, fixed: Duration) -> Self {
        ClockDrift { per_million, fixed }
    }

    /// The allowance for `ttl`.
    pub fn allowance(&self, ttl: Duration) -> Duration {
        let scaled = ttl.as_nanos() * u128::from(self.per_million) / 1_000_000;
        Duration::from_nanos(u64::try_from(scaled).unwrap_or(u64::MAX)) + self.fixed
    }
}

impl Capabilities {
    /// Capabilities named `name` that promise the least: TTLs from 1 ms to 30 days in 1 ms
    /// steps, fencing tokens that may repeat, no release notices, exclusion within this
    /// process only, no clock-drift allowance. Each setter below raises one promise.
    pub const fn new(name: &'static str) -> Self {
        Capabilities {
            name,
            min_ttl: Duration::from_millis(1),
            ttl_granularity: Duration::from_millis(1),
            max_ttl: Duration::from_secs(30 * 24 * 3600),
            max_ttl_hint: "",
            monotonic_fencing: false,
            release_notices: false,
            cross_process: false,
            clock_drift: ClockDrift::NONE,
            max_permits: 1,
            permits_refusal: "claims of several permits on a key (semaphores, reader-writer locks)",
            session_bound: false,
            server_queue: false,
        }
    }

    /// How far the validity of a [session-bound](Self::session_bound) grant reaches: a
    /// century, "until released or the session ends" on a monotonic clock (small enough
    /// that `Instant + SESSION_VALIDITY` never overflows).
    pub const SESSION_VALIDITY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

    /// Sets [`server_queue`](Self::server_queue).
    pub const fn server_queue(mut self, on: bool) -> Self {
        self.server_queue = on;
        self
    }

    /// Sets [`session_bound`](Self::session_bound).
    pub const fn session_bound(mut self, on: bool) -> Self {
        self.session_bound = on;
        self
    }

    /// Sets [`max_permits`](Self::max_permits).
    pub const fn max_permits(mut self, max: u32) -> Self {
        self.max_permits = max;
        self
    }

    /// Sets [`permits_refusal`](Self::permits_refusal).
    pub const fn permits_refusal(mut self, why: &'static str) -> Self {
        self.permits_refusal = why;
        self
    }

    /// Checks a claim against [`max_permits`](Self::max_permits).
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) naming the backend, with
    /// [`permits_refusal`](Self::permits_refusal) as the operation's description.
    pub fn check_permits(&self, permits: Permits) -> Result<()> {
        if permits.of() <= self.max_permits {
            return Ok(());
        }
        Err(crate::Error::Unsupported {
            backend: self.name,
            operation: self.permits_refusal,
        })
    }

    /// Sets [`min_ttl`](Self::min_ttl).
    pub const fn min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// Sets [`ttl_granularity`](Self::ttl_granularity).
    pub const fn ttl_granularity(mut self, granularity: Duration) -> Self {
        self.ttl_granularity = granularity;
        self
    }

    /// Sets [`max_ttl`](Self::max_ttl).
    pub const fn max_ttl(mut self, max_ttl: Duration) -> Self {
        self.max_ttl = max_ttl;
        self
    }

    /// Sets [`max_ttl_hint`](Self::max_ttl_hint).
    pub const fn max_ttl_hint(mut self, hint: &'static str) -> Self {
        self.max_ttl_hint = hint;
        self
    }

    /// Sets [`monotonic_fencing`](Self::monotonic_fencing).
    pub const fn monotonic_fencing(mut self, on: bool) -> Self {
        self.monotonic_fencing = on;
        self
    }

    /// Sets [`release_notices`](Self::release_notices).
    pub const fn release_notices(mut self, on: bool) -> Self {
        self.release_notices = on;
        self
    }

    /// Sets [`cross_process`](Self::cross_process).
    pub const fn cross_process(mut self, on: bool) -> Self {
        self.cross_process = on;
        self
    }

    /// Sets [`clock_drift`](Self::clock_drift).
    pub const fn clock_drift(mut self, drift: ClockDrift) -> Self {
        self.clock_drift = drift;
        self
    }

    /// The least validity a grant or renewal of `ttl` sent at `sent` has once the server
    /// applied it: `sent + ttl − allowance` (never later than `sent + ttl`); for a
    /// [session-bound](Self::session_bound) backend, `sent +`
    /// [`SESSION_VALIDITY`](Self::SESSION_VALIDITY) whatever `ttl` is.
    pub fn validity(&self, sent: Instant, ttl: Duration) -> Instant {
        if self.session_bound {
            return sent
                .checked_add(Self::SESSION_VALIDITY)
                .unwrap_or(sent + ttl);
        }
        sent + ttl.saturating_sub(self.clock_drift.allowance(ttl))
    }

    /// Applies the TTL rules: zero and TTLs above `max_ttl` are refused; TTLs below
    /// `min_ttl` are rounded up to it; every TTL is rounded up to the granularity; a TTL
    /// that its [`clock_drift`](Self::clock_drift) allowance would use up is refused.
    ///
    /// # Errors
    /// [`Error::InvalidTtl`](crate::Error::InvalidTtl) naming the backend and the rule.
    pub fn effective_ttl(&self, ttl: Duration) -> Result<Ttl> {
        let refuse = |reason: String| crate::Error::InvalidTtl {
            ttl,
            backend: self.name,
            reason,
        };
        if ttl.is_zero() {
            return Err(refuse("a lock TTL must be greater than zero".into()));
        }
        if ttl > self.max_ttl {
            return Err(refuse(format!(
                "longer than the backend's maximum of {:?}{}",
                self.max_ttl, self.max_ttl_hint
            )));
        }
        let mut ttl = ttl.max(self.min_ttl);
        let g = self.ttl_granularity.as_nanos();
        // Whole multiples (the usual case: ms or s TTLs) skip the 128-bit division.
        let whole = match g {
            // The usual granularities, with divisions the compiler turns into multiplications.
            1_000_000 => ttl.subsec_nanos().is_multiple_of(1_000_000),
            1_000_000_000 => ttl.subsec_nanos() == 0,
            _ => u32::try_from(g)
                .is_ok_and(|g| 1_000_000_000 % g == 0 && ttl.subsec_nanos().is_multiple_of(g)),
        };
        if g > 1 && !whole {
            let n = ttl.as_nanos();
            let rounded = n.div_ceil(g) * g;
            let secs = u64::try_from(rounded / 1_000_000_000)
                .map_err(|_| refuse("does not fit the backend's representation".into()))?;
            ttl = Duration::new(secs, (rounded % 1_000_000_000) as u32);
        }
        if ttl > self.max_ttl {
            return Err(refuse(format!(
                "longer than the backend's maximum of {:?} after rounding",
                self.max_ttl
            )));
        }
        let allowance = self.clock_drift.allowance(ttl);
        if allowance >= ttl {
            return Err(refuse(format!(
                "the clock-drift allowance of {allowance:?} leaves no validity"
            )));
        }
        Ok(Ttl(ttl))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(min: Duration, gran: Duration) -> Capabilities {
        Capabilities {
            name: "test",
            min_ttl: min,
            ttl_granularity: gran,
            max_ttl: Duration::from_secs(3600),
            max_ttl_hint: "",
            monotonic_fencing: true,
            release_notices: false,
            cross_process: false,
            clock_drift: ClockDrift::NONE,
            max_permits: 1,
            permits_refusal: "",
            session_bound: false,
            server_queue: false,
        }
    }

    #[test]
    fn session_bound_validity_ignores_the_ttl() {
        let now = Instant::now();
        let ttl = Duration::from_millis(300);
        let bound = Capabilities::new("session").session_bound(true);
        assert_eq!(
            bound.validity(now, ttl),
            now + Capabilities::SESSION_VALIDITY
        );
        assert_eq!(Capabilities::new("ttl").validity(now, ttl), now + ttl);
        assert!(bound.effective_ttl(Duration::ZERO).is_err());
    }

    #[test]
    fn ttl_rules() {
        let c = caps(Duration::from_millis(10), Duration::from_millis(1));
        assert!(c.effective_ttl(Duration::ZERO).is_err());
        assert!(c.effective_ttl(Duration::from_secs(3601)).is_err());
        assert!(c.effective_ttl(Duration::MAX).is_err());
        assert_eq!(
            c.effective_ttl(Duration::from_millis(3)).unwrap().get(),
            Duration::from_millis(10)
        );
        assert_eq!(
            c.effective_ttl(Duration::from_micros(10_500))
                .unwrap()
                .get(),
            Duration::from_millis(11)
        );
        let s = caps(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(
            s.effective_ttl(Duration::from_millis(2100)).unwrap().get(),
            Duration::from_secs(3)
        );
        assert_eq!(
            s.effective_ttl(Duration::from_millis(100)).unwrap().get(),
            Duration::from_secs(2)
        );
    }
}
