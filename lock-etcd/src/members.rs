//! The cluster members, one client each, and which one requests go to.
//!
//! etcd-client spreads the requests of one client over all its endpoints at random, so a
//! member that hangs (paused, partitioned, overloaded) keeps receiving its share of them,
//! and each of those waits for the whole timeout. Here every request goes to one preferred
//! member; a request that fails transiently (a timeout, a refused connection) makes the
//! next member the preferred one, so a hung member costs one timeout, not one in N requests.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use lock_core::{Error, Result};

use crate::error::{failed, timed_out, token_expired};

pub(crate) struct Members {
    members: Vec<Member>,
    preferred: AtomicUsize,
    /// Carries the credentials, to connect again when a token expires.
    options: ConnectOptions,
    timeout: Duration,
}

struct Member {
    endpoint: String,
    /// Replaced as a whole when its authentication token expires: etcd-client neither
    /// renews tokens nor can ask for a new one while it holds an expired one.
    client: Arc<RwLock<Arc<Client>>>,
    /// A new client is being connected.
    reconnecting: Arc<AtomicBool>,
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
            })
            .collect();
        Ok(Members {
            members,
            preferred: AtomicUsize::new(0),
            options,
            timeout,
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

    /// A request to member `i` failed transiently: prefer the next member, unless another
    /// request already moved on from `i`.
    pub(crate) fn suspect(&self, i: usize) {
        let next = (i + 1) % self.members.len();
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
