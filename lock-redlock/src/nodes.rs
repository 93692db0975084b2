//! The N nodes of a Redlock ([`Nodes`]): their quorum, the per-node timeout of a request,
//! and how one request goes to all of them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{Error, Result};
use lock_redis::RedisNode;

use crate::fanout::Fanout;
use crate::member::Member;

/// The default per-node timeout is `TTL / 10`, at least this.
pub const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(5);
/// The default per-node timeout is `TTL / 10`, at most this.
pub const MAX_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// The default per-node timeout of requests without a TTL (release, inspect,
/// force-release). Nothing waits on them for its validity, and a release returns as soon as
/// a majority decided it, so this only bounds how long an undecided one waits for slow nodes.
pub const UNTIMED_NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// The nodes, in configuration order, and the number of them a majority needs.
pub(crate) struct Nodes {
    pub(crate) members: Vec<Arc<Member>>,
    pub(crate) quorum: usize,
    /// The configured per-node timeout; `None`: derived from each TTL.
    pub(crate) node_timeout: Option<Duration>,
}

impl Nodes {
    /// The bound on each node's answer to a request with `ttl` (`None`: release, inspect,
    /// force-release), as [`RedlockBackend::timeout_for`](crate::RedlockBackend::timeout_for)
    /// documents it.
    pub(crate) fn timeout_for(&self, ttl: Option<Duration>) -> Duration {
        match (self.node_timeout, ttl) {
            (Some(fixed), _) => fixed,
            (None, Some(ttl)) => (ttl / 10).clamp(MIN_NODE_TIMEOUT, MAX_NODE_TIMEOUT),
            (None, None) => UNTIMED_NODE_TIMEOUT,
        }
    }

    /// Sends `op` to the nodes `targets` at once, each bounded by `timeout`; a node that is
    /// not connected answers with its error at once.
    pub(crate) fn fan_out<T, F, Fut>(
        &self,
        targets: impl IntoIterator<Item = usize>,
        timeout: Duration,
        op: F,
    ) -> Fanout<T>
    where
        F: Fn(RedisNode) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        Fanout::new(
            targets
                .into_iter()
                .map(|i| {
                    let request: std::pin::Pin<Box<dyn Future<Output = Result<T>> + Send>> =
                        match self.members[i].node(timeout) {
                            Ok(node) => Box::pin(op(node)),
                            Err(e) => Box::pin(std::future::ready(Err(e))),
                        };
                    (i, request)
                })
                .collect(),
        )
    }

    /// Sends `op` to every node and waits for every answer: the answers of the nodes that
    /// answered and the number that failed, or the quorum error when fewer than a majority
    /// answered.
    pub(crate) async fn ask_all<T, F, Fut>(&self, op: F) -> Result<(Vec<T>, usize)>
    where
        F: Fn(RedisNode) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let n = self.members.len();
        let replies = self.fan_out(0..n, self.timeout_for(None), op).all().await;
        let mut answers = Vec::with_capacity(n);
        let mut failed = Vec::new();
        for (i, reply) in replies {
            match reply {
                Ok(answer) => answers.push(answer),
                Err(e) => failed.push((i, e)),
            }
        }
        if answers.len() < self.quorum {
            return Err(self.quorum_error(answers.len(), failed));
        }
        Ok((answers, failed.len()))
    }

    /// The error of an operation that missed its quorum because nodes failed: the first
    /// non-transient error when those alone rule the quorum out, else `QuorumNotReached`.
    pub(crate) fn quorum_error(&self, granted: usize, failed: Vec<(usize, Error)>) -> Error {
        let mut errors: Vec<Error> = failed.into_iter().map(|(_, e)| e).collect();
        let fatal = errors.iter().filter(|e| !e.is_transient()).count();
        if fatal > self.members.len() - self.quorum {
            if let Some(i) = errors.iter().position(|e| !e.is_transient()) {
                return errors.swap_remove(i);
            }
        }
        Error::QuorumNotReached {
            granted,
            needed: self.quorum,
            node_errors: errors.into(),
        }
    }
}
