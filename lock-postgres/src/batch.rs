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

use std::collections::HashMap;
use std::sync::Arc;

use lock_core::group::{GroupCommit, GroupKey, GroupSend};
use tokio_postgres::Row;

use crate::connection::Connection;
use crate::error::{Failure, RequestError};

/// One key's request.
pub(crate) enum Request {
    /// Acquire `key` for `owner` for `ttl_ms`.
    Acquire {
        key: Vec<u8>,
        owner: String,
        ttl_ms: i64,
    },
    /// Release `key` if it holds `owner`.
    Release { key: Vec<u8>, owner: String },
    /// Pass `key` from `owner` to `next` for `ttl_ms`, if it still holds `owner` unexpired.
    HandOver {
        key: Vec<u8>,
        owner: String,
        next: String,
        ttl_ms: i64,
    },
}

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
    /// Sends `request` through the group commit `batcher`, within the operation timeout.
    pub(crate) async fn send(
        batcher: &Arc<Batcher>,
        request: Request,
    ) -> Result<Answer, RequestError> {
        let key = GroupKey::of(request.key());
        let patience = batcher.sender().connection.timeout;
        batcher.send(key, request, patience).await
    }

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
    async fn hand_over_group(&self, requests: &[Request]) -> Vec<Result<Answer, RequestError>> {
        const OP: &str = "hand over (grouped)";
        let (mut keys, mut owners, mut ttls, mut nexts) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for request in requests {
            if let Request::HandOver {
                key,
                owner,
                next,
                ttl_ms,
            } = request
            {
                keys.push(key.as_slice());
                owners.push(owner.as_str());
                ttls.push(*ttl_ms);
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
    async fn acquire_group(&self, requests: &[Request]) -> Vec<Result<Answer, RequestError>> {
        const OP: &str = "acquire (grouped)";
        let (mut keys, mut owners, mut ttls) = (Vec::new(), Vec::new(), Vec::new());
        for request in requests {
            if let Request::Acquire { key, owner, ttl_ms } = request {
                keys.push(key.as_slice());
                owners.push(owner.as_str());
                ttls.push(*ttl_ms);
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
    async fn release_group(&self, requests: &[Request]) -> Vec<Result<Answer, RequestError>> {
        const OP: &str = "release (grouped)";
        let (mut keys, mut owners) = (Vec::new(), Vec::new());
        for request in requests {
            if let Request::Release { key, owner } = request {
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
        requests: &[Request],
        rows: Result<Vec<Row>, RequestError>,
        answer: impl Fn(&Self, &Request, &Row) -> Result<Answer, RequestError>,
        missing: impl Fn() -> Option<Answer>,
    ) -> Vec<Result<Answer, RequestError>> {
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                let shared = Arc::new(e.failure);
                return requests
                    .iter()
                    .map(|_| {
                        Err(RequestError {
                            addr: e.addr.clone(),
                            op: e.op,
                            failure: Failure::Shared(shared.clone()),
                            timeout: e.timeout,
                        })
                    })
                    .collect();
            }
        };
        let mut by_key: HashMap<&[u8], &Row> = HashMap::with_capacity(rows.len());
        for row in &rows {
            match row.try_get::<_, &[u8]>(0) {
                Ok(key) => {
                    by_key.insert(key, row);
                }
                Err(e) => {
                    return requests
                        .iter()
                        .map(|_| Err(self.bad_reply(op, &e)))
                        .collect()
                }
            }
        }
        requests
            .iter()
            .map(|request| match by_key.get(request.key()) {
                Some(row) => answer(self, request, row),
                None => {
                    missing().ok_or_else(|| self.bad_reply(op, "no row for a key of the group"))
                }
            })
            .collect()
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

impl Request {
    fn key(&self) -> &[u8] {
        match self {
            Request::Acquire { key, .. }
            | Request::Release { key, .. }
            | Request::HandOver { key, .. } => key,
        }
    }

    /// The owner the request acts for (a hand-over: the one it passes the key from).
    fn owner(&self) -> &str {
        match self {
            Request::Acquire { owner, .. }
            | Request::Release { owner, .. }
            | Request::HandOver { owner, .. } => owner,
        }
    }
}

impl GroupSend for Statements {
    type Request = Request;
    type Answer = Answer;
    type Error = RequestError;

    // Never `dispatched` early: a request on the same key waits for the answer, so a
    // release that cleans up after an abandoned acquisition always runs after it.
    async fn send_one(
        &self,
        request: Request,
        _dispatched: &(dyn Fn() + Sync),
    ) -> Result<Answer, RequestError> {
        match request {
            Request::Acquire { key, owner, ttl_ms } => self.acquire_one(&key, &owner, ttl_ms).await,
            Request::Release { key, owner } => self.release_one(&key, &owner).await,
            Request::HandOver {
                key,
                owner,
                next,
                ttl_ms,
            } => self.hand_over_one(&key, &owner, &next, ttl_ms).await,
        }
    }

    async fn send_group(
        &self,
        requests: Vec<Request>,
        _dispatched: &(dyn Fn() + Sync),
    ) -> Vec<Result<Answer, RequestError>> {
        match requests.first() {
            Some(Request::Acquire { .. }) => self.acquire_group(&requests).await,
            Some(Request::Release { .. }) => self.release_group(&requests).await,
            Some(Request::HandOver { .. }) => self.hand_over_group(&requests).await,
            None => Vec::new(),
        }
    }

    fn no_answer(&self) -> RequestError {
        self.connection.error("group", Failure::Timeout)
    }

    fn groups_with(&self, first: &Request, other: &Request) -> bool {
        std::mem::discriminant(first) == std::mem::discriminant(other)
    }
}
