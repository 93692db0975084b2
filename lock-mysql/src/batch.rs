//! Group commit of acquisitions, releases and hand-overs.
//!
//! Every script costs the server a transaction (its commit, the parsing, the round trip)
//! on top of its work per row. So acquisitions, releases and hand-overs (each kind apart)
//! that arrive while [`MAX_IN_FLIGHT`](lock_core::group::MAX_IN_FLIGHT) scripts are on
//! their way queue and go together as ONE script, one transaction, each key getting the
//! answer its own script would have had. A request arriving when the way is free goes
//! alone at once, so a lone caller waits for nothing.
//!
//! A group never holds two requests on one key (the group commit keeps them apart). Its
//! script locks its keys' rows in ascending key order before anything else (see `sql.rs`),
//! as every other script that locks more than one row does, so two scripts never wait for
//! each other in a cycle; a deadlock the server still reports (InnoDB's checks of
//! duplicate keys take locks of their own) rolls the whole script back: a group of
//! acquisitions fails with the transient error (one attempt: the Locker's waiting policy
//! decides whether to try again), and a group of releases or hand-overs, which nothing
//! above tries again, is sent again (`Again::IfDeadlock`).

use std::sync::Arc;

use lock_core::group::leases::{answer_by_key, fail_all, LeaseRequest};
use lock_core::group::{GroupCommit, GroupSend};
use mysql_async::Row;

use crate::connection::{column, Again, Connection};
use crate::error::{Failure, RequestError};
use crate::sql::{AcquireRow, HandOverRow};

/// A request's answer, as its own script would have given it.
pub(crate) enum Answer {
    /// The acquisition's row: whether it is now the requester's, its fence, the holder's
    /// microseconds left.
    Acquired {
        granted: bool,
        fence: u64,
        left_us: i64,
    },
    /// The release: `None` when no row held the owner, else whether it was still live.
    Released { live: Option<bool> },
    /// The hand-over: the new fence, or `None` when the row no longer held the owner.
    HandedOver { fence: Option<u64> },
}

/// The acquisitions and releases of one backend, sent alone or grouped.
pub(crate) type Batcher = GroupCommit<Scripts>;

/// A new batcher over `connection`.
pub(crate) fn batcher(connection: Connection) -> Arc<Batcher> {
    GroupCommit::new(Scripts { connection })
}

/// Sends requests on the lock connections, each script bounded by the timeout.
pub(crate) struct Scripts {
    pub(crate) connection: Connection,
}

impl Scripts {
    /// One script for every request of `requests` (all of one kind): one answer per
    /// request, in order.
    async fn send_all(&self, requests: &[LeaseRequest]) -> Vec<Result<Answer, RequestError>> {
        let sql = &self.connection.sql;
        let (op, script) = match requests.first() {
            Some(LeaseRequest::Acquire { .. }) => {
                let mut rows: Vec<AcquireRow<'_>> = requests
                    .iter()
                    .filter_map(|r| match r {
                        LeaseRequest::Acquire { key, owner, ttl } => Some(AcquireRow {
                            key,
                            owner,
                            ttl_us: *ttl,
                        }),
                        _ => None,
                    })
                    .collect();
                ("acquire", sql.acquire(&mut rows))
            }
            Some(LeaseRequest::Release { .. }) => (
                "release",
                sql.release(requests.iter().map(|r| (r.key(), r.owner()))),
            ),
            Some(LeaseRequest::HandOver { .. }) => {
                let mut rows: Vec<HandOverRow<'_>> = requests
                    .iter()
                    .filter_map(|r| match r {
                        LeaseRequest::HandOver {
                            key,
                            owner,
                            next,
                            ttl,
                        } => Some(HandOverRow {
                            key,
                            owner,
                            next,
                            ttl_us: *ttl,
                        }),
                        _ => None,
                    })
                    .collect();
                ("hand over", sql.hand_over(&mut rows))
            }
            None => return Vec::new(),
        };
        // A release or a hand-over has no waiting policy above it: one rolled back by a
        // deadlock is sent again; an acquisition is sent again only on a connection found
        // closed (its script is re-entrant for its owner).
        let again = if matches!(requests.first(), Some(LeaseRequest::Acquire { .. })) {
            Again::IfClosedUnseen
        } else {
            Again::IfDeadlock
        };
        let rows = self.connection.script(op, &script, again).await;
        self.answers(op, requests, rows)
    }

    /// Matches the rows of a script (column 0: the key) to its requests: each request gets
    /// its row's answer, or the answer of no row. A failed script fails every request alike.
    fn answers(
        &self,
        op: &'static str,
        requests: &[LeaseRequest],
        rows: Result<Vec<Row>, RequestError>,
    ) -> Vec<Result<Answer, RequestError>> {
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                let shared = Arc::new(e.failure);
                return fail_all(requests.len(), || RequestError {
                    addr: e.addr.clone(),
                    op: e.op,
                    failure: Failure::Shared(shared.clone()),
                    timeout: e.timeout,
                });
            }
        };
        answer_by_key(
            requests,
            &rows,
            |row| column::<Vec<u8>>(row, 0).map_err(Arc::new),
            |shared| self.connection.error(op, Failure::Shared(shared.clone())),
            |request, row| answer(request, row).map_err(|f| self.connection.error(op, f)),
        )
    }
}

/// The answer of `request` from its key's row (`None`: no row came back for the key).
fn answer(request: &LeaseRequest, row: Option<&Row>) -> Result<Answer, Failure> {
    match (request, row) {
        (LeaseRequest::Acquire { owner, .. }, Some(row)) => {
            let holder: String = column(row, 1)?;
            Ok(Answer::Acquired {
                granted: holder == *owner,
                fence: column(row, 2)?,
                left_us: column(row, 3)?,
            })
        }
        (LeaseRequest::Acquire { .. }, None) => Err(Failure::Reply(
            "unexpected reply: no row for a key of the acquisition".into(),
        )),
        (LeaseRequest::Release { .. }, Some(row)) => Ok(Answer::Released {
            live: Some(column::<i64>(row, 1)? != 0),
        }),
        (LeaseRequest::Release { .. }, None) => Ok(Answer::Released { live: None }),
        (LeaseRequest::HandOver { .. }, Some(row)) => Ok(Answer::HandedOver {
            fence: Some(column(row, 1)?),
        }),
        (LeaseRequest::HandOver { .. }, None) => Ok(Answer::HandedOver { fence: None }),
    }
}

impl GroupSend for Scripts {
    type Request = LeaseRequest;
    type Answer = Answer;
    type Error = RequestError;

    // Never `dispatched` early: a request on the same key waits for the answer, so a
    // release that cleans up after an abandoned acquisition always runs after it.
    async fn send_one(
        &self,
        request: LeaseRequest,
        _dispatched: &(dyn Fn() + Sync),
    ) -> Result<Answer, RequestError> {
        let mut answers = self.send_all(std::slice::from_ref(&request)).await;
        answers.pop().unwrap_or_else(|| {
            Err(self
                .connection
                .error("send", Failure::Timeout("waiting for the group's answer")))
        })
    }

    async fn send_group(
        &self,
        requests: Vec<LeaseRequest>,
        _dispatched: &(dyn Fn() + Sync),
    ) -> Vec<Result<Answer, RequestError>> {
        self.send_all(&requests).await
    }

    fn no_answer(&self) -> RequestError {
        self.connection
            .error("group", Failure::Timeout("waiting for the group's answer"))
    }

    fn groups_with(&self, first: &LeaseRequest, other: &LeaseRequest) -> bool {
        first.same_kind(other)
    }
}
