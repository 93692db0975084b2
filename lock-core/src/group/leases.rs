//! The glue the lease-table backends (PostgreSQL, MySQL) share around the group commit:
//! one request type ([`LeaseRequest`]), sending it on its key within a patience
//! ([`GroupCommit::send_lease`]), and matching the rows a grouped call answers to its
//! requests by key ([`answer_by_key`], [`fail_all`]). Each backend keeps what is its own:
//! the statements, the answers, the errors.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use super::{GroupCommit, GroupKey, GroupSend};

/// One key's request to a lease table. The TTL is in the unit the backend's statements
/// take (milliseconds on PostgreSQL, microseconds on MySQL).
#[derive(Debug)]
pub enum LeaseRequest {
    /// Acquire `key` for `owner` for `ttl`.
    Acquire {
        /// The key.
        key: Vec<u8>,
        /// The owner's token.
        owner: String,
        /// The TTL, in the backend's unit.
        ttl: i64,
    },
    /// Release `key` if it holds `owner`.
    Release {
        /// The key.
        key: Vec<u8>,
        /// The owner's token.
        owner: String,
    },
    /// Pass `key` from `owner` to `next` for `ttl`, if it still holds `owner` unexpired.
    HandOver {
        /// The key.
        key: Vec<u8>,
        /// The token of the owner it passes from.
        owner: String,
        /// The token of the owner it passes to.
        next: String,
        /// The TTL, in the backend's unit.
        ttl: i64,
    },
}

impl LeaseRequest {
    /// The key the request acts on (its only one).
    pub fn key(&self) -> &[u8] {
        match self {
            LeaseRequest::Acquire { key, .. }
            | LeaseRequest::Release { key, .. }
            | LeaseRequest::HandOver { key, .. } => key,
        }
    }

    /// The owner the request acts for (a hand-over: the one it passes the key from).
    pub fn owner(&self) -> &str {
        match self {
            LeaseRequest::Acquire { owner, .. }
            | LeaseRequest::Release { owner, .. }
            | LeaseRequest::HandOver { owner, .. } => owner,
        }
    }

    /// Whether `other` is of the same kind: each kind is its own statement, so only
    /// requests of one kind go in one group ([`GroupSend::groups_with`]).
    pub fn same_kind(&self, other: &LeaseRequest) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

impl<S: GroupSend<Request = LeaseRequest>> GroupCommit<S> {
    /// Sends `request` on its key ([`GroupCommit::send`]), answered within `patience`
    /// (the backend's operation timeout) when it has to queue.
    ///
    /// # Errors
    /// As [`GroupCommit::send`].
    pub async fn send_lease(
        self: &Arc<Self>,
        request: LeaseRequest,
        patience: Duration,
    ) -> Result<S::Answer, S::Error> {
        let key = GroupKey::of(request.key());
        self.send(key, request, patience).await
    }
}

/// The results of a group that failed as a whole: every one of its `requests` fails
/// alike, each with an error `each` makes (the same failure, shared).
pub fn fail_all<A, E>(requests: usize, mut each: impl FnMut() -> E) -> Vec<Result<A, E>> {
    (0..requests).map(|_| Err(each())).collect()
}

/// Matches the rows a grouped statement answered to its `requests`, by key: each request
/// gets `answer` of its key's row (`None`: no row came back for its key), in order. A row
/// whose key cannot be read (`key_of` fails) fails every request alike, with the error
/// `unreadable` makes of its failure: rows that cannot be told apart answer nobody.
pub fn answer_by_key<'r, R, K, F, A, E>(
    requests: &[LeaseRequest],
    rows: &'r [R],
    key_of: impl Fn(&'r R) -> Result<K, F>,
    unreadable: impl Fn(&F) -> E,
    answer: impl Fn(&LeaseRequest, Option<&'r R>) -> Result<A, E>,
) -> Vec<Result<A, E>>
where
    K: Borrow<[u8]> + Hash + Eq,
{
    let mut by_key: HashMap<K, &'r R> = HashMap::with_capacity(rows.len());
    for row in rows {
        match key_of(row) {
            Ok(key) => {
                by_key.insert(key, row);
            }
            Err(failure) => return fail_all(requests.len(), || unreadable(&failure)),
        }
    }
    requests
        .iter()
        .map(|request| answer(request, by_key.get(request.key()).copied()))
        .collect()
}
