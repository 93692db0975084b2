//! Group commit of the acquire and release transactions.
//!
//! Every etcd write costs a raft round and a WAL sync, and on etcd 3.4 every transaction
//! with a comparison also copies the server's read buffer: a transaction costs several
//! times a plain put. So transactions that arrive while [`MAX_IN_FLIGHT`](lock_core::group::MAX_IN_FLIGHT) others are on
//! their way are queued and go together, as the nested transactions of one outer
//! transaction (etcd ≥ 3.3): each keeps its own comparison and its own outcome, and the
//! group costs one write. A transaction arriving when the way is free goes alone at once,
//! so a lone caller waits for nothing.
//!
//! A group never holds two transactions on the same key (etcd refuses a transaction that
//! writes a key twice); the later one waits for the next group. When etcd refuses a whole
//! group for one member's sake (a lease that ran out), each member is sent alone, so every
//! caller gets the answer its own transaction would have had.

// etcd-client's own error type is large; it is passed through to the callers, which map it
// at once, as they did when they sent their transactions themselves.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Txn, TxnOp, TxnOpResponse, TxnResponse};
use lock_core::group::{GroupCommit, GroupSend};

use crate::error::is_transient;
use crate::members::Members;

/// One transaction's answer, as if it had been sent alone.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The transaction's own response (nested responses carry no header).
    pub(crate) response: TxnResponse,
    /// The store revision after the (outer) transaction: the revision of its writes.
    pub(crate) revision: i64,
}

impl Answer {
    pub(crate) fn succeeded(&self) -> bool {
        self.response.succeeded()
    }

    fn alone(response: TxnResponse) -> Self {
        let revision = response.header().map_or(0, |h| h.revision());
        Answer { response, revision }
    }
}

/// The acquire and release transactions of one backend, sent alone or grouped.
pub(crate) type Batcher = GroupCommit<Txns>;

/// A new batcher over the backend's members.
pub(crate) fn batcher(members: Arc<Members>, timeout: Duration) -> Arc<Batcher> {
    GroupCommit::new(Txns { members, timeout })
}

/// Sends transactions to the preferred member, each call bounded by the timeout.
pub(crate) struct Txns {
    members: Arc<Members>,
    timeout: Duration,
}

impl Txns {
    /// One transaction, bounded by the timeout (a group's member re-sent alone).
    async fn alone(&self, txn: Txn) -> Result<Answer, etcd_client::Error> {
        match tokio::time::timeout(self.timeout, self.unbounded(txn)).await {
            Ok(answer) => answer,
            Err(_) => Err(no_answer_in_time()),
        }
    }

    /// One transaction, for a caller that bounds it itself.
    async fn unbounded(&self, txn: Txn) -> Result<Answer, etcd_client::Error> {
        let mut kv = self.members.client().kv_client();
        kv.txn(txn).await.map(Answer::alone)
    }
}

impl GroupSend for Txns {
    type Request = Txn;
    type Answer = Answer;
    type Error = etcd_client::Error;

    // Never `dispatched` early: etcd may apply concurrent requests in any order, so a
    // request on the same key waits for the answer. Every caller of a lone send bounds it
    // by the operation timeout already.
    async fn send_one(
        &self,
        txn: Txn,
        _dispatched: &(dyn Fn() + Sync),
    ) -> Result<Answer, etcd_client::Error> {
        self.unbounded(txn).await
    }

    async fn send_group(
        &self,
        txns: Vec<Txn>,
        _dispatched: &(dyn Fn() + Sync),
    ) -> Vec<Result<Answer, etcd_client::Error>> {
        let mut kv = self.members.client().kv_client();
        let outer = Txn::new().and_then(txns.iter().cloned().map(TxnOp::txn).collect::<Vec<_>>());
        match tokio::time::timeout(self.timeout, kv.txn(outer)).await {
            Ok(Ok(response)) => {
                let revision = response.header().map_or(0, |h| h.revision());
                let mut answers = response.op_responses().into_iter();
                txns.iter()
                    .map(|_| match answers.next() {
                        Some(TxnOpResponse::Txn(response)) => Ok(Answer { response, revision }),
                        _ => Err(etcd_client::Error::InvalidArgs(
                            "etcd answered a group without one answer per transaction".into(),
                        )),
                    })
                    .collect()
            }
            Ok(Err(e)) if !is_transient(&e) => {
                // Refused as a whole, perhaps for one member's sake: nothing of it was
                // applied, so each member goes alone and gets its own answer.
                futures::future::join_all(txns.into_iter().map(|txn| self.alone(txn))).await
            }
            Ok(Err(e)) => txns
                .iter()
                .map(|_| {
                    Err(etcd_client::Error::IoError(std::io::Error::other(
                        e.to_string(),
                    )))
                })
                .collect(),
            Err(_) => txns.iter().map(|_| Err(no_answer_in_time())).collect(),
        }
    }

    fn no_answer(&self) -> etcd_client::Error {
        etcd_client::Error::IoError(std::io::Error::other(
            "the group carrying this request ended without an answer",
        ))
    }
}

fn no_answer_in_time() -> etcd_client::Error {
    etcd_client::Error::IoError(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer from etcd within the operation timeout",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_client::{Compare, CompareOp, ConnectOptions, PutOptions};
    use lock_core::group::GroupKey;
    use lock_testkit::EtcdServer;

    fn create(key: &str, lease: i64) -> Txn {
        let options = (lease != 0).then(|| PutOptions::new().with_lease(lease));
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, "v", options)])
    }

    async fn connect(server: &EtcdServer) -> Arc<Batcher> {
        let timeout = Duration::from_secs(5);
        let members =
            Members::connect(&[server.endpoint()], ConnectOptions::new(), timeout, "test")
                .await
                .expect("connect");
        batcher(Arc::new(members), timeout)
    }

    /// Transactions sent together are grouped, and each gets its own outcome and the
    /// revision of its write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_transactions_are_grouped_with_their_own_outcomes() {
        let server = EtcdServer::start().await;
        let b = connect(&server).await;
        // "taken" exists already, so its creation must fail inside the group.
        b.send(
            GroupKey::of("g/taken"),
            create("g/taken", 0),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        let keys: Vec<String> = (0..40)
            .map(|i| format!("g/{i}"))
            .chain(["g/taken".to_owned()])
            .collect();
        let answers = futures::future::join_all(keys.iter().map(|k| {
            b.send(
                GroupKey::of(k.as_str()),
                create(k, 0),
                Duration::from_secs(5),
            )
        }))
        .await;
        let mut revisions = std::collections::HashSet::new();
        for (key, answer) in keys.iter().zip(answers) {
            let answer = answer.expect("answered");
            assert_eq!(answer.succeeded(), key != "g/taken", "{key}");
            assert!(answer.revision > 0);
            revisions.insert(answer.revision);
        }
        assert!(
            revisions.len() < keys.len() / 2,
            "41 concurrent transactions went as {} writes: not grouped",
            revisions.len()
        );
        assert_eq!(b.queued(), 0);
    }

    /// A group etcd refuses as a whole for one member's sake (a lease that does not exist)
    /// gives that member its error and the others their own answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_bad_member_does_not_fail_its_group() {
        let server = EtcdServer::start().await;
        let b = connect(&server).await;
        let mut calls = Vec::new();
        for i in 0..20 {
            let key = format!("bad/{i}");
            let lease = if i == 7 { 0x7eed_beef } else { 0 };
            calls.push((key.clone(), create(&key, lease)));
        }
        let answers = futures::future::join_all(calls.iter().map(|(k, txn)| {
            b.send(
                GroupKey::of(k.as_str()),
                txn.clone(),
                Duration::from_secs(5),
            )
        }))
        .await;
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(answer) => {
                    assert_ne!(i, 7, "a put on a missing lease cannot succeed");
                    assert!(answer.succeeded(), "member {i}");
                }
                Err(e) => {
                    assert_eq!(i, 7, "member {i} failed: {e}");
                    assert!(crate::error::is_lease_not_found(&e), "{e}");
                }
            }
        }
    }
}
