//! Group commit of acquisitions, releases and hand-overs.
//!
//! Every statement costs the server a transaction (its commit record, the executor's set-up,
//! the round trip) on top of its work per row, and the lock connection is served by one
//! server process. So acquisitions, releases and hand-overs (each kind apart) that arrive
//! while
//! [`MAX_IN_FLIGHT`](lock_core::group::MAX_IN_FLIGHT) statements are on their way
//! queue and go together as ONE statement over arrays (`unnest`), one transaction, each row
//! getting the answer its own statement would have had. A request arriving when the way is
//! free goes alone at once, as its single statement, so a lone caller waits for nothing.
//!
//! A group never holds two requests on one key (the group commit keeps them apart), so
//! each row is written once per statement. A grouped statement first takes the advisory
//! locks of all its keys in ascending order, as the single granting statements take their
//! key's: row locks are then only ever waited for by a statement that holds every advisory
//! lock it will take, or by a single-row statement that holds nothing else, so two
//! statements never wait for each other in a cycle (see `sql.rs`).

use std::sync::Arc;

use lock_core::group::leases::{answer_by_key, fail_all, LeaseRequest};
use lock_core::group::{GroupCommit, GroupSend};
use tokio_postgres::Row;

use crate::connection::Connection;
use crate::error::{Failure, RequestError};

/// A request's answer, as its own statement would have given it.
pub(crate) enum Answer {
    /// The acquisition's row: whether it is now the requester's, its fence, the holder's
    /// milliseconds left.
    Acquired {
        granted: bool,
        fence: i64,
        left: i64,
        /// When the key is held with permits (its row is their marker, owner `*<of>`,
        /// see `permits.rs`): their `of`.
        permits_of: Option<u32>,
    },
    /// The release: `None` when no row held the owner, else whether it was still live.
    Released { live: Option<bool> },
    /// The hand-over: the new fence, or `None` when the row no longer held the owner.
    HandedOver { fence: Option<i64> },
}

/// The acquisitions and releases of one backend, sent alone or grouped.
pub(crate) type Batcher = GroupCommit<Statements>;

/// A new batcher over `connection`.
pub(crate) fn batcher(connection: Connection) -> Arc<Batcher> {
    GroupCommit::new(Statements { connection })
}

/// Sends requests on the lock connection, each statement bounded by its timeout.
pub(crate) struct Statements {
    pub(crate) connection: Connection,
}

impl Statements {
    async fn acquire_one(
        &self,
        key: &[u8],
        owner: &str,
        ttl_ms: i64,
    ) -> Result<Answer, RequestError> {
        const OP: &str = "acquire";
        let rows = self
            .connection
            .query(OP, |s| &s.acquire, &[&key, &owner, &ttl_ms])
            .await?;
        let [row] = rows.as_slice() else {
            return Err(self.bad_reply(OP, format!("{} rows", rows.len())));
        };
        Ok(Answer::Acquired {
            granted: self.get(OP, row, 0)?,
            fence: self.get(OP, row, 1)?,
            left: self.get(OP, row, 2)?,
            permits_of: marker_of(self.get(OP, row, 3)?),
        })
    }

    async fn release_one(&self, key: &[u8], owner: &str) -> Result<Answer, RequestError> {
        const OP: &str = "release";
        let channel = &self.connection.names.channel;
        let rows = self
            .connection
            .query(OP, |s| &s.release, &[&key, &owner, channel])
            .await?;
        match rows.as_slice() {
            [] => Ok(Answer::Released { live: None }),
            [row] => Ok(Answer::Released {
                live: Some(self.get(OP, row, 0)?),
            }),
            more => Err(self.bad_reply(OP, format!("{} rows", more.len()))),
        }
    }

    async fn hand_over_one(
        &self,
        key: &[u8],
        owner: &str,
        next: &str,
        ttl_ms: i64,
    ) -> Result<Answer, RequestError> {
        const OP: &str = "hand over";
        let rows = self
            .connection
            .query(OP, |s| &s.hand_over, &[&key, &owner, &ttl_ms, &next])
            .await?;
        match rows.as_slice() {
            [] => Ok(Answer::HandedOver { fence: None }),
            [row] => Ok(Answer::HandedOver {
                fence: Some(self.get(OP, row, 0)?),
            }),
            more => Err(self.bad_reply(OP, format!("{} rows", more.len()))),
        }
    }

    /// One statement for every hand-over of the group: one answer per request, in order.
    async fn hand_over_group(
        &self,
        requests: &[LeaseRequest],
    ) -> Vec<Result<Answer, RequestError>> {
        const OP: &str = "hand over (grouped)";
        let (mut keys, mut owners, mut ttls, mut nexts) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for request in requests {
            if let LeaseRequest::HandOver {
                key,
                owner,
                next,
                ttl,
            } = request
            {
                keys.push(key.as_slice());
                owners.push(owner.as_str());
                ttls.push(*ttl);
                nexts.push(next.as_str());
            }
        }
        let rows = self
            .connection
            .query(OP, |s| &s.hand_over_many, &[&keys, &owners, &ttls, &nexts])
            .await;
        self.answers(
            OP,
            requests,
            rows,
            |this, _, row| {
                Ok(Answer::HandedOver {
                    fence: Some(this.get(OP, row, 1)?),
                })
            },
            // No row: the key no longer held the owner.
            || Some(Answer::HandedOver { fence: None }),
        )
    }

    /// One statement for every acquisition of the group: one answer per request, in order.
    async fn acquire_group(&self, requests: &[LeaseRequest]) -> Vec<Result<Answer, RequestError>> {
        const OP: &str = "acquire (grouped)";
        let (mut keys, mut owners, mut ttls) = (Vec::new(), Vec::new(), Vec::new());
        for request in requests {
            if let LeaseRequest::Acquire { key, owner, ttl } = request {
                keys.push(key.as_slice());
                owners.push(owner.as_str());
                ttls.push(*ttl);
            }
        }
        let rows = self
            .connection
            .query(OP, |s| &s.acquire_many, &[&keys, &owners, &ttls])
            .await;
        self.answers(
            OP,
            requests,
            rows,
            |this, request, row| {
                let owner: &str = this.get(OP, row, 1)?;
                Ok(Answer::Acquired {
                    granted: owner == request.owner(),
                    fence: this.get(OP, row, 2)?,
                    left: this.get(OP, row, 3)?,
                    permits_of: marker_of(owner),
                })
            },
            || None,
        )
    }

    /// One statement for every release of the group: one answer per request, in order.
    async fn release_group(&self, requests: &[LeaseRequest]) -> Vec<Result<Answer, RequestError>> {
        const OP: &str = "release (grouped)";
        let (mut keys, mut owners) = (Vec::new(), Vec::new());
        for request in requests {
            if let LeaseRequest::Release { key, owner } = request {
                keys.push(key.as_slice());
                owners.push(owner.as_str());
            }
        }
        let channel = &self.connection.names.channel;
        let rows = self
            .connection
            .query(OP, |s| &s.release_many, &[&keys, &owners, channel])
            .await;
        self.answers(
            OP,
            requests,
            rows,
            |this, _, row| {
                Ok(Answer::Released {
                    live: Some(this.get(OP, row, 1)?),
                })
            },
            // No row: the key did not hold the owner.
            || Some(Answer::Released { live: None }),
        )
    }

    /// Matches the rows of a grouped statement (column 0: the key) to its requests: each
    /// request gets its row's answer, or `missing`'s when its key has no row (an error
    /// when `missing` gives none). A failed statement fails every request alike.
    fn answers(
        &self,
        op: &'static str,
        requests: &[LeaseRequest],
        rows: Result<Vec<Row>, RequestError>,
        answer: impl Fn(&Self, &LeaseRequest, &Row) -> Result<Answer, RequestError>,
        missing: impl Fn() -> Option<Answer>,
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
            |row| row.try_get::<_, &[u8]>(0),
            |e| self.bad_reply(op, e),
            |request, row| match row {
                Some(row) => answer(self, request, row),
                None => {
                    missing().ok_or_else(|| self.bad_reply(op, "no row for a key of the group"))
                }
            },
        )
    }

    fn bad_reply(&self, op: &'static str, what: impl std::fmt::Display) -> RequestError {
        self.connection
            .error(op, Failure::Reply(format!("unexpected reply: {what}")))
    }

    fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
        &self,
        op: &'static str,
        row: &'a Row,
        i: usize,
    ) -> Result<T, RequestError> {
        row.try_get(i).map_err(|e| self.bad_reply(op, e))
    }
}

/// The `of` of a marker row's owner `*<of>` (a key held with permits); `None` for an owner
/// token (a lock's holder).
pub(crate) fn marker_of(owner: &str) -> Option<u32> {
    owner.strip_prefix('*').map(|of| of.parse().unwrap_or(0))
}

impl GroupSend for Statements {
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
        match request {
            LeaseRequest::Acquire { key, owner, ttl } => self.acquire_one(&key, &owner, ttl).await,
            LeaseRequest::Release { key, owner } => self.release_one(&key, &owner).await,
            LeaseRequest::HandOver {
                key,
                owner,
                next,
                ttl,
            } => self.hand_over_one(&key, &owner, &next, ttl).await,
        }
    }

    async fn send_group(
        &self,
        requests: Vec<LeaseRequest>,
        _dispatched: &(dyn Fn() + Sync),
    ) -> Vec<Result<Answer, RequestError>> {
        match requests.first() {
            Some(LeaseRequest::Acquire { .. }) => self.acquire_group(&requests).await,
            Some(LeaseRequest::Release { .. }) => self.release_group(&requests).await,
            Some(LeaseRequest::HandOver { .. }) => self.hand_over_group(&requests).await,
            None => Vec::new(),
        }
    }

    fn no_answer(&self) -> RequestError {
        self.connection.error("group", Failure::Timeout)
    }

    fn groups_with(&self, first: &LeaseRequest, other: &LeaseRequest) -> bool {
        first.same_kind(other)
    }
}
