//! Fire-time claims ([`FireClaims`]): one key per job, in a key space of its own beside the
//! locks.
//!
//! Job `job`'s claim is the key `<root><job>`, `<root>` being
//! [`beside_prefix`](Shared::beside_prefix)`("claims")` (`distlock.claims/` with the default
//! prefix): no claim key is a lock key, and the release watch never sees one. Its value is
//! the fire time in milliseconds since the Unix epoch as 20 decimal digits (zero-padded, so
//! that etcd's byte-wise value comparison orders claims by fire time), a space, and the
//! replica. The key has no lease: claims outlive locks.

use std::time::SystemTime;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};
use lock_core::claims::{fire_millis, from_fire_millis, ClaimAnswer, FireClaim, FireClaims};
use lock_core::{Error, Result};

use crate::backend::EtcdBackend;
use crate::error::{failed, unexpected, NAME};
use crate::shared::Shared;

/// Digits of a claim's fire time: every `u64` fits.
const DIGITS: usize = 20;

/// Below every claim's value (the epoch's fire time and a space, with no replica): a value
/// that is not above it is not a claim, and is never replaced.
const BELOW_EVERY_CLAIM: &str = "00000000000000000000 ";

/// The key of `job`'s claim: `<root><job>`.
fn claim_key(shared: &Shared, job: &str) -> String {
    let mut key = shared.beside_prefix("claims");
    key.push_str(job);
    key
}

/// The value comparisons order by fire time: every claim of a fire time older than
/// `fire_ms` is below it, every claim of `fire_ms` or newer above it (it is a claim of
/// `fire_ms` with no replica).
fn fire_bound(fire_ms: u64) -> String {
    format!("{fire_ms:0DIGITS$} ")
}

/// A claim's value: the fire time's [`fire_bound`], then the replica.
fn encode(fire_ms: u64, replica: &str) -> String {
    let mut value = fire_bound(fire_ms);
    value.push_str(replica);
    value
}

/// The claim a key's value holds, or [`Error::Backend`] when it is not one.
fn decode(kv: &KeyValue) -> Result<FireClaim> {
    let value = kv.value();
    let claim = std::str::from_utf8(value).ok().and_then(|text| {
        let digits = text.get(..DIGITS)?;
        let replica = text.get(DIGITS..)?.strip_prefix(' ')?;
        let plain = digits.bytes().all(|b| b.is_ascii_digit()) && !replica.is_empty();
        let fire_ms: u64 = digits.parse().ok().filter(|_| plain)?;
        Some(FireClaim::new(from_fire_millis(fire_ms), replica, None))
    });
    claim.ok_or_else(|| {
        let shown: String = String::from_utf8_lossy(value).chars().take(64).collect();
        Error::backend(
            NAME,
            format!(
                "the value of {:?} is not a fire-time claim: {shown:?}",
                String::from_utf8_lossy(kv.key())
            ),
        )
    })
}

/// The claim transaction: if the key does not exist, put our claim; otherwise, if it holds
/// a claim of an older fire time, put ours over it, else read it (a nested transaction,
/// etcd ≥ 3.3: a value comparison on a missing key would fail, hence the outer one).
fn claim_txn(key: &str, fire_ms: u64, replica: &str) -> Txn {
    let ours = encode(fire_ms, replica);
    let over_older = Txn::new()
        .when([
            Compare::value(key, CompareOp::Greater, BELOW_EVERY_CLAIM),
            Compare::value(key, CompareOp::Less, fire_bound(fire_ms)),
        ])
        .and_then([TxnOp::put(key, ours.clone(), None)])
        .or_else([TxnOp::get(key, None)]);
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key, ours, None)])
        .or_else([TxnOp::txn(over_older)])
}

/// Whether the claim transaction's answer put our claim; if not, the claim it read.
fn claim_outcome(answer: &TxnResponse) -> Result<std::result::Result<(), FireClaim>> {
    if answer.succeeded() {
        return Ok(Ok(()));
    }
    let inner = match answer.op_responses().into_iter().next() {
        Some(TxnOpResponse::Txn(inner)) => inner,
        _ => return Err(unexpected("a claim transaction without its nested answer")),
    };
    if inner.succeeded() {
        return Ok(Ok(()));
    }
    match inner.op_responses().into_iter().next() {
        Some(TxnOpResponse::Get(get)) => match get.kvs().first() {
            Some(kv) => decode(kv).map(Err),
            None => Err(unexpected("a refused claim without the claim kept")),
        },
        _ => Err(unexpected("a refused claim without its read")),
    }
}

impl Shared {
    /// One transaction ([`claim_txn`]) within the operation timeout.
    async fn claim(&self, job: &str, fire_time: SystemTime, replica: &str) -> Result<ClaimAnswer> {
        const DOING: &str = "claiming a fire time";
        let fire_ms = fire_millis(job, fire_time)?;
        let key = claim_key(self, job);
        let mut kv = self.client().kv_client();
        let answer = self
            .within(DOING, async {
                kv.txn(claim_txn(&key, fire_ms, replica))
                    .await
                    .map_err(failed(DOING))
            })
            .await?;
        Ok(match claim_outcome(&answer)? {
            Ok(()) => ClaimAnswer::new(
                true,
                FireClaim::new(from_fire_millis(fire_ms), replica, None),
                None,
            ),
            Err(kept) => ClaimAnswer::new(false, kept, None),
        })
    }

    /// One get within the operation timeout.
    async fn current_claim(&self, job: &str) -> Result<Option<FireClaim>> {
        const DOING: &str = "reading a fire-time claim";
        let mut kv = self.client().kv_client();
        let answer = self
            .within(DOING, async {
                kv.get(claim_key(self, job), None)
                    .await
                    .map_err(failed(DOING))
            })
            .await?;
        answer.kvs().first().map(decode).transpose()
    }
}

/// The scheduler's fire-time claims in the cluster, beside the locks: job `job`'s claim is
/// the key `<prefix minus its last character>.claims/<job>` (`distlock.claims/…` with the
/// default prefix), its value the fire time as 20 zero-padded decimal digits of
/// milliseconds, a space and the replica, on no lease. A claim is one transaction (put if
/// the key is missing, else put if its value is a claim of an older fire time, else read
/// it); a read is one get. Every request is bounded by the operation timeout and goes to
/// the preferred member, as the lock's do; none touches a lock key, lease or watch.
///
/// etcd has no clock a client can read: `claimed_at` and `server_time` are `None`, and the
/// scheduler counts "not before the fire time" on the replica's clock. A value under the
/// claims' root that is not a claim is [`Error::Backend`]; the claim transaction replaces
/// only a value between `00000000000000000000 ` and the new claim's, so a foreign value is
/// left as it is unless it begins like a claim of an older fire time (zero-padded digits).
#[async_trait]
impl FireClaims for EtcdBackend {
    async fn claim(&self, job: &str, fire_time: SystemTime, replica: &str) -> Result<ClaimAnswer> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.claim(job, fire_time, replica).await;
        self.shared.members.note(member, result)
    }

    async fn current(&self, job: &str) -> Result<Option<FireClaim>> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.current_claim(job).await;
        self.shared.members.note(member, result)
    }
}
