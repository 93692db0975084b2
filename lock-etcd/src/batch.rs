//! Group commit of the acquire and release transactions.
//!
//! Every etcd write costs a raft round and a WAL sync, and on etcd 3.4 every transaction
//! with a comparison also copies the server's read buffer: a transaction costs several
//! times a plain put. So transactions that arrive while [`MAX_IN_FLIGHT`] others are on
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

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::sync::oneshot;

use crate::error::is_transient;
use crate::members::Members;

/// Groups (or lone transactions) on their way at once.
const MAX_IN_FLIGHT: usize = 2;
/// Transactions in one group: etcd refuses more than `--max-txn-ops` (default 128) operations
/// in one transaction.
const MAX_GROUP: usize = 64;

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

type Reply = oneshot::Sender<Result<Answer, etcd_client::Error>>;

struct Pending {
    key: String,
    txn: Txn,
    reply: Reply,
}

#[derive(Default)]
struct State {
    in_flight: usize,
    queue: VecDeque<Pending>,
}

/// Sends transactions, grouping those that arrive while the way is busy.
pub(crate) struct Batcher {
    members: Arc<Members>,
    timeout: Duration,
    state: Mutex<State>,
}

impl Batcher {
    pub(crate) fn new(members: Arc<Members>, timeout: Duration) -> Arc<Self> {
        Arc::new(Batcher {
            members,
            timeout,
            state: Mutex::default(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `txn`, which writes only `key`, alone or in a group. Not bounded here: callers
    /// bound it with their operation's deadline (a group is bounded by the timeout too).
    pub(crate) async fn txn(
        self: &Arc<Self>,
        key: &str,
        txn: Txn,
    ) -> Result<Answer, etcd_client::Error> {
        let waiting = {
            let mut state = self.state();
            if state.in_flight < MAX_IN_FLIGHT && state.queue.is_empty() {
                state.in_flight += 1;
                Err(txn)
            } else {
                let (reply, answer) = oneshot::channel();
                state.queue.push_back(Pending {
                    key: key.to_owned(),
                    txn,
                    reply,
                });
                self.launch(&mut state);
                Ok(answer)
            }
        };
        match waiting {
            Ok(answer) => answer.await.unwrap_or_else(|_| Err(dropped())),
            Err(txn) => {
                let _slot = Slot(self);
                let response = self.members.client().kv_client().txn(txn).await?;
                Ok(Answer::alone(response))
            }
        }
    }

    /// Sends queued transactions as groups while there is room on the way.
    fn launch(self: &Arc<Self>, state: &mut State) {
        while state.in_flight < MAX_IN_FLIGHT && !state.queue.is_empty() {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                // No runtime (shutting down): the callers get an error from their dropped
                // replies.
                state.queue.clear();
                return;
            };
            let group = take_group(&mut state.queue);
            state.in_flight += 1;
            let me = self.clone();
            runtime.spawn(async move {
                let _slot = Slot(&me);
                me.send_group(group).await;
            });
        }
    }

    async fn send_group(&self, group: Vec<Pending>) {
        let client = self.members.client();
        let mut kv = client.kv_client();
        if group.len() == 1 {
            let Some(Pending { txn, reply, .. }) = group.into_iter().next() else {
                return;
            };
            let answer = tokio::time::timeout(self.timeout, kv.txn(txn)).await;
            let _ = reply.send(
                answer
                    .unwrap_or_else(|_| Err(timed_out()))
                    .map(Answer::alone),
            );
            return;
        }
        let outer = Txn::new().and_then(
            group
                .iter()
                .map(|p| TxnOp::txn(p.txn.clone()))
                .collect::<Vec<_>>(),
        );
        match tokio::time::timeout(self.timeout, kv.txn(outer)).await {
            Ok(Ok(response)) => {
                let revision = response.header().map_or(0, |h| h.revision());
                let mut answers = response.op_responses().into_iter();
                for Pending { reply, .. } in group {
                    let answer = match answers.next() {
                        Some(TxnOpResponse::Txn(response)) => Ok(Answer { response, revision }),
                        _ => Err(etcd_client::Error::InvalidArgs(
                            "etcd answered a group without one answer per transaction".into(),
                        )),
                    };
                    let _ = reply.send(answer);
                }
            }
            Ok(Err(e)) if !is_transient(&e) => {
                // Refused as a whole, perhaps for one member's sake: nothing of it was
                // applied, so each member goes alone and gets its own answer.
                let alone = group.into_iter().map(|Pending { txn, reply, .. }| {
                    let mut kv = client.kv_client();
                    async move {
                        let answer = tokio::time::timeout(self.timeout, kv.txn(txn)).await;
                        let _ = reply.send(
                            answer
                                .unwrap_or_else(|_| Err(timed_out()))
                                .map(Answer::alone),
                        );
                    }
                });
                futures::future::join_all(alone).await;
            }
            Ok(Err(e)) => {
                for Pending { reply, .. } in group {
                    let _ = reply.send(Err(etcd_client::Error::IoError(std::io::Error::other(
                        e.to_string(),
                    ))));
                }
            }
            Err(_) => {
                for Pending { reply, .. } in group {
                    let _ = reply.send(Err(timed_out()));
                }
            }
        }
    }

    /// Number of transactions waiting for a group.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.state().queue.len()
    }
}

/// A place on the way; leaving it sends what waits.
struct Slot<'a>(&'a Arc<Batcher>);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.in_flight -= 1;
        self.0.launch(&mut state);
    }
}

/// Up to [`MAX_GROUP`] queued transactions on distinct keys, oldest first; the others keep
/// their place.
fn take_group(queue: &mut VecDeque<Pending>) -> Vec<Pending> {
    let mut keys = HashSet::new();
    let mut group = Vec::new();
    let mut later = VecDeque::new();
    while let Some(p) = queue.pop_front() {
        if group.len() < MAX_GROUP && keys.insert(p.key.clone()) {
            group.push(p);
        } else {
            later.push_back(p);
        }
    }
    *queue = later;
    group
}

fn timed_out() -> etcd_client::Error {
    etcd_client::Error::IoError(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer from etcd within the operation timeout",
    ))
}

fn dropped() -> etcd_client::Error {
    etcd_client::Error::IoError(std::io::Error::other(
        "the group carrying this request ended without an answer",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_client::{Compare, CompareOp, ConnectOptions, PutOptions};
    use lock_testkit::EtcdServer;

    fn create(key: &str, lease: i64) -> Txn {
        let options = (lease != 0).then(|| PutOptions::new().with_lease(lease));
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, "v", options)])
    }

    fn pending(
        key: &str,
    ) -> (
        Pending,
        oneshot::Receiver<Result<Answer, etcd_client::Error>>,
    ) {
        let (reply, answer) = oneshot::channel();
        let txn = create(key, 0);
        let key = key.to_owned();
        (Pending { key, txn, reply }, answer)
    }

    #[test]
    fn a_group_holds_each_key_once_and_at_most_max_group() {
        let mut queue: VecDeque<Pending> = ["a", "b", "a", "c", "b"]
            .into_iter()
            .map(|k| pending(k).0)
            .collect();
        let group = take_group(&mut queue);
        let keys: Vec<&str> = group.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        let left: Vec<&str> = queue.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(left, ["a", "b"], "the later ones keep their order");

        let mut many: VecDeque<Pending> = (0..MAX_GROUP + 5)
            .map(|i| pending(&format!("k{i}")).0)
            .collect();
        assert_eq!(take_group(&mut many).len(), MAX_GROUP);
        assert_eq!(many.len(), 5);
    }

    async fn batcher(server: &EtcdServer) -> Arc<Batcher> {
        let timeout = Duration::from_secs(5);
        let members =
            Members::connect(&[server.endpoint()], ConnectOptions::new(), timeout, "test")
                .await
                .expect("connect");
        Batcher::new(Arc::new(members), timeout)
    }

    /// Transactions sent together are grouped, and each gets its own outcome and the
    /// revision of its write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_transactions_are_grouped_with_their_own_outcomes() {
        let server = EtcdServer::start().await;
        let b = batcher(&server).await;
        // "taken" exists already, so its creation must fail inside the group.
        b.txn("g/taken", create("g/taken", 0)).await.unwrap();
        let keys: Vec<String> = (0..40)
            .map(|i| format!("g/{i}"))
            .chain(["g/taken".to_owned()])
            .collect();
        let answers = futures::future::join_all(keys.iter().map(|k| b.txn(k, create(k, 0)))).await;
        let mut revisions = HashSet::new();
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
        let b = batcher(&server).await;
        let mut calls = Vec::new();
        for i in 0..20 {
            let key = format!("bad/{i}");
            let lease = if i == 7 { 0x7eed_beef } else { 0 };
            calls.push((key.clone(), create(&key, lease)));
        }
        let answers =
            futures::future::join_all(calls.iter().map(|(k, txn)| b.txn(k, txn.clone()))).await;
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
