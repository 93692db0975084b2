//! The cluster members, one client each, and which one requests go to.
//!
//! etcd-client spreads the requests of one client over all its endpoints at random, so a
//! member that hangs (paused, partitioned, overloaded) keeps receiving its share of them,
//! and each of those waits for the whole timeout. Here every request goes to one preferred
//! member; a request that fails transiently (a timeout, a refused connection) makes the
//! next member the preferred one, so a hung member costs one timeout, not one in N requests.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};
use lock_core::{Error, Result};

use crate::error::{failed, timed_out, token_expired};

pub(crate) struct Members {
    members: Vec<Member>,
    preferred: AtomicUsize,
    /// Carries the credentials, to connect again when a token expires.
    options: ConnectOptions,
    timeout: Duration,
    /// The origin of the members' answer times.
    epoch: Instant,
}

struct Member {
    endpoint: String,
    /// Replaced as a whole when its authentication token expires: etcd-client neither
    /// renews tokens nor can ask for a new one while it holds an expired one.
    client: Arc<RwLock<Arc<Client>>>,
    /// A new client is being connected.
    reconnecting: Arc<AtomicBool>,
    /// When a request to it last succeeded, in µs since [`Members::epoch`] plus one (0:
    /// never).
    last_ok: AtomicU64,
    /// When a request to it last failed transiently, likewise.
    last_failed: AtomicU64,
}

impl Members {
    /// One client per endpoint. Without credentials this does no I/O. With credentials each
    /// member is asked for a token (all at once, each within `timeout`); a member that cannot
    /// be reached then is served by the client of one that could, until its token expires.
    ///
    /// # Errors
    /// When no member can be reached, or the credentials are refused.
    pub(crate) async fn connect(
        endpoints: &[String],
        options: ConnectOptions,
        timeout: Duration,
        doing: &str,
    ) -> Result<Members> {
        let connecting = endpoints.iter().map(|endpoint| {
            let options = options.clone();
            async move {
                let doing = format!("{doing} ({endpoint})");
                match tokio::time::timeout(timeout, Client::connect([endpoint], Some(options)))
                    .await
                {
                    Ok(Ok(client)) => Ok(client),
                    Ok(Err(e)) => Err(failed(doing)(e)),
                    Err(_) => Err(timed_out(&doing, timeout)),
                }
            }
        });
        let mut results = futures::future::join_all(connecting).await;
        // Refused credentials are not worth trying the other members with.
        if let Some(refused) = results
            .iter()
            .position(|r| r.as_ref().is_err_and(|e| !e.is_transient()))
        {
            results.swap_remove(refused)?;
        }
        let Some(working) = results.iter().find_map(|r| r.as_ref().ok()).cloned() else {
            let first = results.into_iter().find_map(Result::err);
            return Err(first.unwrap_or_else(|| timed_out(doing, timeout)));
        };
        let members = endpoints
            .iter()
            .zip(results)
            .map(|(endpoint, client)| Member {
                endpoint: endpoint.clone(),
                client: Arc::new(RwLock::new(Arc::new(
                    client.unwrap_or_else(|_| working.clone()),
                ))),
                reconnecting: Arc::default(),
                last_ok: AtomicU64::new(0),
                last_failed: AtomicU64::new(0),
            })
            .collect();
        Ok(Members {
            members,
            preferred: AtomicUsize::new(0),
            options,
            timeout,
            epoch: Instant::now(),
        })
    }

    /// The preferred member: its index (to report a failure with) and its client.
    pub(crate) fn pick(&self) -> (usize, Arc<Client>) {
        let i = self.preferred.load(Ordering::Relaxed) % self.members.len();
        let client = self.members[i]
            .client
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        (i, client)
    }

    /// The preferred member's client.
    pub(crate) fn client(&self) -> Arc<Client> {
        self.pick().1
    }

    /// Now, as stored in [`Member::last_ok`] and [`Member::last_failed`].
    fn stamp(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX - 1) + 1
    }

    /// A request to member `i` failed transiently: prefer the next member whose last
    /// answer was not a failure; when every other member's was, the one that answered
    /// last. So a member that is still hung costs no second timeout when a healthy one is
    /// slow once. Nothing changes when another request already moved on from `i`.
    pub(crate) fn suspect(&self, i: usize) {
        self.members[i]
            .last_failed
            .store(self.stamp(), Ordering::Relaxed);
        let n = self.members.len();
        let others = (1..n).map(|step| (i + step) % n);
        let healthy = |j: &usize| {
            let m = &self.members[*j];
            m.last_failed.load(Ordering::Relaxed) <= m.last_ok.load(Ordering::Relaxed)
        };
        let next = others
            .clone()
            .find(healthy)
            .or_else(|| {
                others.min_by_key(|&j| {
                    std::cmp::Reverse(self.members[j].last_ok.load(Ordering::Relaxed))
                })
            })
            .unwrap_or(i);
        let _ = self
            .preferred
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Notes the outcome of an operation that used member `i`: after a transient failure
    /// the next member is preferred, and after an expired token member `i` gets a new client
    /// in the background (the operation's caller retries the transient error).
    pub(crate) fn note<T>(&self, i: usize, result: Result<T>) -> Result<T> {
        match &result {
            Err(e) if token_expired(e) => self.reconnect(i),
            Err(Error::Unavailable { .. }) => self.suspect(i),
            Ok(_) => self.members[i]
                .last_ok
                .store(self.stamp(), Ordering::Relaxed),
            _ => {}
        }
        result
    }

    fn reconnect(&self, i: usize) {
        let member = &self.members[i];
        if member.reconnecting.swap(true, Ordering::SeqCst) {
            return;
        }
        let (endpoint, options, timeout) =
            (member.endpoint.clone(), self.options.clone(), self.timeout);
        let (slot, busy) = (member.client.clone(), member.reconnecting.clone());
        tokio::spawn(async move {
            let fresh = tokio::time::timeout(timeout, Client::connect([endpoint], Some(options)));
            match fresh.await {
                Ok(Ok(client)) => {
                    *slot.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(client)
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot renew the etcd authentication token")
                }
                Err(_) => tracing::warn!("cannot renew the etcd authentication token: timed out"),
            }
            busy.store(false, Ordering::SeqCst);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> Result<()> {
        Err(Error::unavailable("etcd", "no answer"))
    }

    /// Member 0 hangs; member 1 and then member 2 are each slow once: the preference never
    /// goes back to member 0, which has not answered since it hung.
    #[tokio::test]
    async fn a_hung_member_is_not_preferred_again_when_a_healthy_one_is_slow_once() {
        // Clients connect lazily: no server is needed to choose between them.
        let endpoints: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", 9 + i)).collect();
        let members = Members::connect(
            &endpoints,
            ConnectOptions::new(),
            Duration::from_millis(100),
            "test",
        )
        .await
        .expect("lazy clients");
        for i in 0..3 {
            let _ = members.note(i, Ok(()));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(members.pick().0, 0);
        let _ = members.note(0, unavailable());
        assert_eq!(members.pick().0, 1, "the next member after a failure");
        let _ = members.note(1, Ok(()));
        let _ = members.note(1, unavailable());
        assert_eq!(
            members.pick().0,
            2,
            "the next member whose last answer was good"
        );
        let _ = members.note(2, unavailable());
        assert_eq!(
            members.pick().0,
            1,
            "every member failed last: the one that answered last, not the hung one"
        );
        let _ = members.note(1, Ok(()));
        let _ = members.note(1, unavailable());
        assert_eq!(members.pick().0, 2);
    }
}
