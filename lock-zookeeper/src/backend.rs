//! [`ZooKeeperBackend`]: the lock recipe of Curator's `InterProcessMutex` as one-attempt
//! operations, with the [`Backend`], [`Admin`], [`LeaderValues`] and [`Baseline`] traits.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::election::{Leader, LeaderValues};
use lock_core::sync::lock;
use lock_core::{
    Admin, Attempt, Backend, Baseline, Capabilities, ClockDrift, Error, Holder, Lease, Owner,
    Permits, ReleaseListener, ReleaseNotices, Result, Ttl,
};
use zookeeper_client as zk;

use crate::config::ZooKeeperBuilder;
use crate::error::{ends_session, failed, is_transient, timed_out, NAME};
use crate::names::{in_line, key_node, lock_prefix};
use crate::session::{Session, Sessions};

/// The share of a grant's TTL set aside before its validity ends: a grant or renewal sent
/// at `t` with TTL `ttl` (at most the session timeout) is believed until
/// `t + ttl × (1 − 0.1)`. See the crate's design notes: the servers expire a session a
/// session timeout after the last touch its leader knows of, which a touch relayed by a
/// follower reaches late or not at all.
pub const VALIDITY_MARGIN_PER_MILLION: u32 = 100_000;

/// What the backend promises before it knows the session timeout; [`ZooKeeperBackend`]'s
/// own capabilities have `max_ttl` set to the timeout the ensemble granted.
pub const CAPABILITIES: Capabilities = Capabilities::new(NAME)
    .min_ttl(Duration::from_millis(1))
    .ttl_granularity(Duration::from_millis(1))
    .monotonic_fencing(true)
    .release_notices(true)
    .cross_process(true)
    .server_queue(true)
    .max_ttl_hint(
        " (the session timeout the ensemble granted: raise the URL's `session_timeout`, within the servers' maxSessionTimeout, or ask for a shorter TTL)",
    )
    .clock_drift(ClockDrift::new(VALIDITY_MARGIN_PER_MILLION, Duration::ZERO))
    .permits_refusal(
        "claims of several permits on a key (the ZooKeeper backend keeps locks and elections only)",
    );

/// The first byte of a lock node's data once its holder published a leader's value.
const PUBLISHED: u8 = 1;

/// Locks on a ZooKeeper ensemble: one ephemeral sequential node per grant under the key's
/// node, the lowest holding (Curator's `InterProcessMutex`); build it with
/// [`ZooKeeperBackend::builder`] or [`ZooKeeperBackend::connect`]
/// (`zookeeper://host:port,…[/root]`).
///
/// Rules it keeps:
/// - a grant is the owner's node being the lowest of the key's lock nodes; it lasts until
///   released or until the session ends (the server deletes ephemeral nodes then);
/// - a grant's validity is counted from before the request that proved the session alive
///   and reaches `min(ttl, session timeout) × 0.9` past it
///   ([`VALIDITY_MARGIN_PER_MILLION`]), so a holder never believes it holds once the
///   servers could have expired its session, paused process or not; the longest TTL is the
///   session timeout the ensemble granted;
/// - a disconnection ends every grant made before it (Curator's "SUSPENDED is lost"): the
///   next renewal answers [`Error::NotHeld`] and the guard's `lost()` fires;
/// - the fence is the `czxid` of the holder's node: zxids strictly increase across the
///   ensemble and grants of a key happen in node order, so fences increase across grants of
///   a key (short of restoring the ensemble from an older snapshot);
/// - node names carry the owner token, so an attempt whose answer never came is found and
///   removed ([`Backend::abandon`]).
///
#[doc = include_str!("design.md")]
pub struct ZooKeeperBackend {
    inner: Arc<Inner>,
}

struct Inner {
    sessions: Sessions,
    caps: Capabilities,
    notices: Arc<ReleaseNotices>,
    /// The nodes of this backend's grants, by owner token.
    held: Mutex<HashMap<Owner, Held>>,
    /// The nodes of refused attempts, by owner token: their places in the key's line,
    /// kept for the same owner's next attempt (the Locker abandons them when it gives up).
    waiting: Mutex<HashMap<Owner, Waiting>>,
    root: String,
    timeout: Duration,
}

/// A refused attempt's node, waiting for its turn: its name, the session it lives in and
/// its `czxid` (the fence it will be granted with).
struct Waiting {
    key: Arc<str>,
    name: String,
    session: i64,
    czxid: i64,
}

/// One grant: its node, the session (and disconnection count) it was made in, and when
/// the backend deletes the node unless it is extended first (the TTL, kept by the
/// holder's process; the session timeout bounds it when that process cannot run).
struct Held {
    key: Arc<str>,
    path: String,
    session: i64,
    epoch: u64,
    expires_at: Instant,
}

impl std::fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("config", self.inner.sessions.config())
            .field("held", &lock(&self.inner.held).len())
            .finish()
    }
}

/// How a request ended: `Ok(Ok)` answered, `Ok(Err)` refused by the server for a reason
/// the caller acts on (no node, node exists), `Err` failed (transient or not).
type Answer<T> = Result<std::result::Result<T, zk::Error>>;

impl ZooKeeperBackend {
    /// A builder for the ensemble whose members `hosts` lists (`host:port,host:port`).
    pub fn builder(hosts: impl Into<String>) -> ZooKeeperBuilder {
        ZooKeeperBuilder::new(hosts)
    }

    /// The backend a `zookeeper://` URL describes, connected.
    ///
    /// # Errors
    /// As [`ZooKeeperBuilder::from_url`] and [`ZooKeeperBuilder::build`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> lock_core::Result<()> {
    /// use lock_core::{LockUrl, Locker};
    /// use lock_zookeeper::ZooKeeperBackend;
    ///
    /// let url = LockUrl::parse("zookeeper://zk1:2181,zk2:2181,zk3:2181/myapp")?;
    /// let locker = Locker::new(ZooKeeperBackend::connect(&url).await?);
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &lock_core::LockUrl) -> Result<ZooKeeperBackend> {
        ZooKeeperBuilder::from_url(url)?.build().await
    }

    /// The session timeout the ensemble granted to the current session (the longest TTL).
    pub fn session_timeout(&self) -> Duration {
        self.inner.caps.max_ttl
    }

    /// Grants of this backend now held (nodes it believes are its holders').
    pub fn held_grants(&self) -> usize {
        lock(&self.inner.held).len()
    }

    /// The node of `key` (its lock nodes are its children).
    pub fn key_path(&self, key: &str) -> String {
        key_node(&self.inner.root, key)
    }

    /// The names of `key`'s lock nodes now, in line order (every session's): for tests and
    /// tools.
    ///
    /// # Errors
    /// Transient errors when the ensemble does not answer.
    pub async fn lock_nodes(&self, key: &str) -> Result<Vec<String>> {
        let s = self.inner.sessions.get().await?;
        let dir = key_node(&self.inner.root, key);
        match self
            .inner
            .ask(&s, "list lock nodes", s.client.list_children(&dir))
            .await?
        {
            Ok(children) => Ok(in_line(children).into_iter().map(|l| l.2).collect()),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(failed("list lock nodes", e)),
        }
    }
}

impl ZooKeeperBuilder {
    /// Connects a session to the ensemble and returns the backend; its longest TTL is the
    /// session timeout the ensemble granted.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a malformed configuration; [`Error::Unavailable`] when no
    /// member answers within the timeout.
    ///
    /// # Cancel safety
    /// A dropped call leaves nothing behind: a session it may have opened is closed with
    /// its client (or expires on the servers within the session timeout).
    pub async fn build(self) -> Result<ZooKeeperBackend> {
        self.checked()?;
        let notices = Arc::new(ReleaseNotices::new());
        let root = self.get_root().to_owned();
        let timeout = self.get_timeout();
        let sessions = Sessions::connect(self, notices.clone()).await?;
        let granted = sessions
            .peek()
            .map_or(Duration::ZERO, |s| s.timeout)
            .max(Duration::from_millis(1));
        let caps = CAPABILITIES.max_ttl(granted);
        let inner = Inner {
            sessions,
            caps,
            notices,
            held: Mutex::new(HashMap::new()),
            waiting: Mutex::new(HashMap::new()),
            root,
            timeout,
        };
        Ok(ZooKeeperBackend {
            inner: Arc::new(inner),
        })
    }
}

mod requests;

#[async_trait]
impl Backend for ZooKeeperBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    /// Creates the owner's ephemeral sequential node under the key's node and lists the
    /// line (one round trip), or, when this owner's earlier attempt left its node waiting
    /// in this session, lists the line only. Granted when the node is the lowest: the
    /// fence is its `czxid`. Otherwise the node stays (the owner's place in the line, see
    /// [`Capabilities::server_queue`]), a watch is left on the node just before it (it
    /// wakes the key's listeners when that node goes: no herd), and the answer is
    /// `Taken`. `ttl` only bounds the validity (see [`ZooKeeperBackend`]).
    ///
    /// # Cancel safety
    /// The create is sent at once; a dropped call may leave the node behind, which the
    /// Locker's [`abandon`](Backend::abandon) finds by its owner token and deletes (sent on
    /// the same session after the create, so the server sees it after). A waiting node is
    /// left for the same owner's next attempt or its abandonment.
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        if permits != Permits::LOCK {
            return Err(Error::InvalidPermits {
                reason: "the ZooKeeper backend keeps locks only".into(),
            });
        }
        let inner = &self.inner;
        let sent = Instant::now();
        let s = inner.sessions.get().await?;
        let epoch = s.epoch();
        let dir = key_node(&inner.root, key);
        let kept = lock(&inner.waiting)
            .get(&owner)
            .filter(|w| *w.key == *key && w.session == s.id)
            .map(|w| (w.name.clone(), w.czxid));
        let (czxid, name, children) = match kept {
            Some((name, czxid)) => {
                const OP: &str = "list the key's lock nodes";
                match inner.ask(&s, OP, s.client.list_children(&dir)).await? {
                    Ok(children) => (czxid, name, children),
                    Err(zk::Error::NoNode) => (czxid, name, Vec::new()),
                    Err(e) => return Err(failed(OP, e)),
                }
            }
            None => {
                let (stat, name, children) = inner.enter(&s, &dir, owner).await?;
                (stat.czxid, name, children)
            }
        };
        let path = format!("{dir}/{name}");
        let line = in_line(children);
        let Some(place) = line.iter().position(|l| l.2 == name) else {
            // Our node is gone already: the session ended meanwhile.
            lock(&inner.waiting).remove(&owner);
            return Err(Error::unavailable(
                NAME,
                "the lock node was not in the line (session lost?)",
            ));
        };
        if place == 0 {
            lock(&inner.waiting).remove(&owner);
            let Ok(fence) = u64::try_from(czxid) else {
                return Err(Error::backend(NAME, "a negative czxid"));
            };
            lock(&inner.held).insert(
                owner,
                Held {
                    key: Arc::from(key),
                    path,
                    session: s.id,
                    epoch,
                    expires_at: sent + ttl.get(),
                },
            );
            tokio::spawn(expire(Arc::downgrade(&self.inner), owner));
            return Ok(Attempt::Granted {
                fence,
                valid_until: inner.validity(&s, sent, ttl),
            });
        }
        let predecessor = format!("{dir}/{}", line[place - 1].2);
        // Watched again at every attempt: a watch fires once, on any change of the node
        // (a published leader's value too), and the waiter must still learn of its end.
        inner.watch(&s, key, &predecessor).await?;
        lock(&inner.waiting).insert(
            owner,
            Waiting {
                key: Arc::from(key),
                name,
                session: s.id,
                czxid,
            },
        );
        Ok(Attempt::Taken { expires_in: None })
    }

    /// Checks, through the leader (a `multi` holding one version check, which is a write
    /// and so linearized), that the lease's node still exists in the session it was made
    /// in, with no disconnection since; the new validity counts from before the check.
    ///
    /// # Cancel safety
    /// A check only: dropping it changes nothing on the server.
    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        let inner = &self.inner;
        let sent = Instant::now();
        let current = inner.sessions.peek();
        let (path, s, epoch) = match lock(&inner.held).get_mut(&lease.owner()) {
            // Not lapsed, and its session alive without a disconnection since the grant:
            // the node now lives until `ttl` from before the check.
            Some(h) if *h.key == *lease.key() && sent < h.expires_at => {
                match current.filter(|s| s.id == h.session && s.keeps(h.epoch)) {
                    Some(s) => {
                        h.expires_at = sent + ttl.get();
                        (h.path.clone(), s, h.epoch)
                    }
                    None => return Err(lease.not_held()),
                }
            }
            _ => return Err(lease.not_held()),
        };
        let mut check = s.client.new_multi_writer();
        check
            .add_check_version(&path, -1)
            .map_err(|e| failed("check the lock node", e))?;
        let answer = inner
            .ask(&s, "check the lock node", async {
                check.commit().await.map_err(zk::Error::from)
            })
            .await;
        match answer {
            Ok(Ok(_)) if s.keeps(epoch) => Ok(inner.validity(&s, sent, ttl)),
            Ok(Ok(_)) | Ok(Err(zk::Error::NoNode)) => Err(lease.not_held()),
            Ok(Err(e)) => Err(failed("check the lock node", e)),
            Err(_) if !s.keeps(epoch) => Err(lease.not_held()),
            Err(e) => Err(e),
        }
    }

    /// Deletes the lease's node if it is this backend's grant to the lease's owner; the
    /// deletion wakes the next node's waiter in every process.
    ///
    /// # Cancel safety
    /// The delete is sent at once: a dropped call may delete the node or not. A delete that
    /// fails transiently ends the session, so the server deletes the node with it within
    /// the session timeout.
    async fn release(&self, lease: &Lease) -> Result<()> {
        let inner = &self.inner;
        let held = {
            let mut held = lock(&inner.held);
            match held.get(&lease.owner()) {
                Some(h) if *h.key == *lease.key() => held.remove(&lease.owner()),
                _ => None,
            }
        };
        let Some(held) = held else {
            return Err(lease.not_held());
        };
        let Some(s) = inner.sessions.peek().filter(|s| s.id == held.session) else {
            return Err(lease.not_held());
        };
        let deleted = inner.delete(&s, "delete the lock node", &held.path).await;
        inner.notices.notify(lease.key());
        match deleted {
            Ok(true) if s.keeps(held.epoch) => Ok(()),
            Ok(_) => Err(lease.not_held()),
            Err(e) => {
                if e.is_transient() {
                    s.end();
                }
                Err(e)
            }
        }
    }

    fn listen(&self, key: &str) -> Option<ReleaseListener> {
        Some(self.inner.notices.listen(key))
    }

    /// Deletes every node of `owner` under the key's node, found by the owner token in its
    /// name (Curator's protected mode), and forgets the grant if one was recorded.
    ///
    /// # Cancel safety
    /// Dropping it may leave the node; it then lasts until the session ends.
    async fn abandon(&self, key: &str, owner: Owner) -> Result<()> {
        lock(&self.inner.held).remove(&owner);
        lock(&self.inner.waiting).remove(&owner);
        self.inner.remove_owner(key, owner).await
    }

    fn admin(&self) -> Option<&dyn Admin> {
        Some(self)
    }

    fn baseline(&self) -> Option<&dyn Baseline> {
        Some(self)
    }

    fn leader_values(&self) -> Option<&dyn LeaderValues> {
        Some(self)
    }
}

mod abilities;

/// Deletes `owner`'s node once its TTL passed without an extension: the expiry a TTL
/// server keeps, kept here by the holder's process (its validity ended earlier, at 0.9 of
/// the TTL). Ends early when the grant is released or the backend dropped.
async fn expire(inner: std::sync::Weak<Inner>, owner: Owner) {
    loop {
        let at = {
            let Some(inner) = inner.upgrade() else { return };
            let held = lock(&inner.held);
            match held.get(&owner) {
                Some(h) => h.expires_at,
                None => return,
            }
        };
        tokio::time::sleep_until(at.into()).await;
        let Some(inner) = inner.upgrade() else { return };
        let lapsed = {
            let mut held = lock(&inner.held);
            match held.get(&owner) {
                Some(h) if h.expires_at <= Instant::now() => held.remove(&owner),
                Some(_) => continue,
                None => return,
            }
        };
        let Some(held) = lapsed else { return };
        if let Some(s) = inner.sessions.peek().filter(|s| s.id == held.session) {
            match inner
                .delete(&s, "delete an expired lock node", &held.path)
                .await
            {
                Ok(_) => {}
                // The session ends, and the node with it, within the session timeout.
                Err(e) => {
                    tracing::debug!(key = &*held.key, error = %e.report(), "zookeeper: deleting an expired lock node failed; ending the session");
                    s.end();
                }
            }
        }
        inner.notices.notify(&held.key);
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_is_nine_tenths_of_the_ttl() {
        let now = Instant::now();
        assert_eq!(
            CAPABILITIES.validity(now, Duration::from_secs(10)),
            now + Duration::from_secs(9)
        );
        const { assert!(!CAPABILITIES.session_bound) };
    }
}
