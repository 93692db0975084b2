//! Leaders' values ([`LeaderValues`]): per election, a value key beside the lock prefix,
//! put only while the lock key holds the publisher, and a notice key announcements touch.
//!
//! Election `name`'s keys are `<root>v/<name>` (its leader's value) and `<root>n/<name>`
//! (touched by [`announce`](LeaderValues::announce)), `<root>` being
//! [`beside_prefix`](Shared::beside_prefix)`("leaders")` (`distlock.leaders/` with the
//! default prefix): no such key is a lock key, so the release watch never sees one, and the
//! leaders' watch (`watch.rs`, [`Kind::Leaders`](crate::watch::Kind::Leaders)) sees every
//! put under `<root>`. The value is `<owner>:<term>:` and the value's bytes, on no lease.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};
use lock_core::election::{Leader, LeaderValues};
use lock_core::{Lease, Owner, Result};

use crate::backend::EtcdBackend;
use crate::error::{failed, unexpected};
use crate::leader_keys::{NOTICE, VALUE};
use crate::shared::{beside_prefix, Shared};
use crate::txn::{seen, stored_value};

/// The root of the leaders' keys for the lock prefix `prefix` (the leaders' watch covers it).
pub(crate) fn root(prefix: &str) -> String {
    beside_prefix(prefix, "leaders")
}

/// The key `<root><mark><name>`.
fn leaders_key(shared: &Shared, mark: &str, name: &str) -> String {
    let mut key = root(&shared.prefix);
    key.push_str(mark);
    key.push_str(name);
    key
}

/// A value key's value: `<owner>:<term>:` and the value.
fn encode(owner: Owner, term: u64, value: &[u8]) -> Vec<u8> {
    let mut stored = format!("{owner}:{term}:").into_bytes();
    stored.extend_from_slice(value);
    stored
}

/// The owner, term and value a value key holds; `None` when it holds something else.
fn decode(kv: &KeyValue) -> Option<(Owner, u64, Vec<u8>)> {
    let stored = kv.value();
    let colon = |from: usize| {
        stored[from..]
            .iter()
            .position(|&b| b == b':')
            .map(|at| at + from)
    };
    let first = colon(0)?;
    let second = colon(first + 1)?;
    let owner = Owner::parse(std::str::from_utf8(&stored[..first]).ok()?)?;
    let term = std::str::from_utf8(&stored[first + 1..second])
        .ok()?
        .parse()
        .ok()?;
    Some((owner, term, stored[second + 1..].to_vec()))
}

/// The publication: if the lock key holds `lease`'s owner (its value is the owner token, or
/// the token and the fence after a move to a new lease), put the value key; a nested
/// transaction (etcd ≥ 3.3, as the group commit's) tries the second form.
fn publish_txn(lock_key: &str, value_key: &str, lease: &Lease, stored: Vec<u8>) -> Txn {
    let holds = |value_fence| {
        Compare::value(
            lock_key,
            CompareOp::Equal,
            stored_value(lease.owner(), value_fence),
        )
    };
    let put = || TxnOp::put(value_key, stored.clone(), None);
    let moved = Txn::new()
        .when([holds(Some(lease.fence()))])
        .and_then([put()]);
    Txn::new()
        .when([holds(None)])
        .and_then([put()])
        .or_else([TxnOp::txn(moved)])
}

/// Whether the publication put the value key.
fn published(answer: &TxnResponse) -> Result<bool> {
    if answer.succeeded() {
        return Ok(true);
    }
    match answer.op_responses().into_iter().next() {
        Some(TxnOpResponse::Txn(inner)) => Ok(inner.succeeded()),
        _ => Err(unexpected("a publication without its nested answer")),
    }
}

/// The first key a read of the leader transaction's `at`-th operation found.
fn read_at(answer: &TxnResponse, at: usize) -> Option<KeyValue> {
    match answer.op_responses().into_iter().nth(at) {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
        _ => None,
    }
}

impl Shared {
    /// One transaction ([`publish_txn`]) within the operation timeout, then wakes this
    /// process's listeners at once (the leaders' watch wakes the others').
    async fn publish(&self, lease: &Lease, value: &[u8]) -> Result<()> {
        const DOING: &str = "publishing a leader's value";
        // A grant past its validity is not held, even while its key lingers on the lease's
        // headroom.
        if lease.is_expired() {
            return Err(lease.not_held());
        }
        let lock_key = self.full_key(lease.key());
        let value_key = leaders_key(self, VALUE, lease.key());
        let txn = publish_txn(
            &lock_key,
            &value_key,
            lease,
            encode(lease.owner(), lease.fence(), value),
        );
        let mut kv = self.client().kv_client();
        let answer = self
            .within(DOING, async { kv.txn(txn).await.map_err(failed(DOING)) })
            .await?;
        if !published(&answer)? {
            return Err(lease.not_held());
        }
        self.notices.notify(lease.key());
        Ok(())
    }

    /// One transaction reading the lock key and the value key at one revision, then the
    /// holder's time left (as a refused attempt learns it); both watches are asked to cover
    /// the key from the revision after the read, so that an observer listening before it
    /// hears of every later release, publication and announcement.
    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        const DOING: &str = "reading a leader";
        let txn = Txn::new().and_then([
            TxnOp::get(self.full_key(key), None),
            TxnOp::get(leaders_key(self, VALUE, key), None),
        ]);
        let mut kv = self.client().kv_client();
        let answer = self
            .within(DOING, async { kv.txn(txn).await.map_err(failed(DOING)) })
            .await?;
        let revision = answer
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| unexpected("a read without a header"))?;
        self.demand.ensure(key, revision.saturating_add(1));
        self.leaders_demand.ensure(key, revision.saturating_add(1));
        let (Some(holder), Some(published)) = (read_at(&answer, 0), read_at(&answer, 1)) else {
            return Ok(None);
        };
        let holder = seen(&holder);
        let Some((owner, term, value)) = decode(&published) else {
            return Ok(None);
        };
        if holder.owner != Some(owner) {
            // A value left by an earlier holder.
            return Ok(None);
        }
        let expires_in: Option<Duration> =
            tokio::time::timeout(self.timeout, self.expires_in(Some(&holder)))
                .await
                .ok()
                .flatten();
        Ok(Some(Leader::new(value, term, owner, expires_in)))
    }

    /// One put of the notice key within the operation timeout (the leaders' watch of every
    /// process sees it), and this process's listeners woken at once.
    async fn announce(&self, key: &str) -> Result<()> {
        const DOING: &str = "announcing a leader's release";
        self.notices.notify(key);
        let notice = leaders_key(self, NOTICE, key);
        let mut kv = self.client().kv_client();
        self.within(DOING, async {
            kv.put(notice, Vec::new(), None)
                .await
                .map_err(failed(DOING))
        })
        .await?;
        Ok(())
    }
}

/// Leaders' values in the cluster, beside the locks: election `name`'s value is the key
/// `<prefix minus its last character>.leaders/v/<name>` (`distlock.leaders/v/…` with the
/// default prefix), holding the owner, the term and the value, put by one transaction only
/// while the lock key holds the publisher. The key is on no lease: a value left by an
/// earlier leader stays until the next one publishes, and is never answered, since its
/// owner is not the lock key's. An announcement puts `….leaders/n/<name>`. Every process
/// reading a leader watches `….leaders/` (every put wakes the election's listeners) and the
/// lock prefix (a release or expiry does) while some listener listens. Every request is
/// bounded by the operation timeout and goes to the preferred member.
#[async_trait]
impl LeaderValues for EtcdBackend {
    async fn publish(&self, lease: &Lease, value: &[u8]) -> Result<()> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.publish(lease, value).await;
        self.shared.members.note(member, result)
    }

    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.leader(key).await;
        self.shared.members.note(member, result)
    }

    async fn announce(&self, key: &str) -> Result<()> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.announce(key).await;
        self.shared.members.note(member, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader_keys::election_of;

    #[test]
    fn a_value_key_names_its_election() {
        assert_eq!(election_of(b"v/a/b"), Some("a/b"));
        assert_eq!(election_of(b"n/a"), Some("a"));
        assert_eq!(election_of(b"x/a"), None);
        assert_eq!(root("distlock/"), "distlock.leaders/");
    }
}
