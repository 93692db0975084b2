//! The transactions on a grant's key (a lock key; a holder key of permits, see
//! `permits.rs`, for release and extension), and what their answers show. A lock's
//! acquisition is `permits.rs`'s [`Claim::first`](crate::permits::Claim::first).

use etcd_client::{
    Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lock_core::Owner;

/// What a read of a lock key showed.
pub(crate) struct Seen {
    pub(crate) owner: Option<Owner>,
    pub(crate) lease: i64,
    /// The holder's fencing token.
    pub(crate) fence: i64,
}

/// Hand-over: if the key still holds `from`'s value, put it with `to`'s, on `lease`.
pub(crate) fn hand_over_txn(
    full: &str,
    from: Owner,
    value_fence: Option<u64>,
    to: Owner,
    lease: i64,
) -> Txn {
    Txn::new()
        .when([Compare::value(
            full,
            CompareOp::Equal,
            stored_value(from, value_fence),
        )])
        .and_then([TxnOp::put(
            full,
            stored_value(to, None),
            Some(PutOptions::new().with_lease(lease)),
        )])
}

/// Release: delete the grant's key (a lock key, or a holder key of permits) only while it
/// holds `owner`'s value.
pub(crate) fn release_txn(full: &[u8], owner: Owner, value_fence: Option<u64>) -> Txn {
    Txn::new()
        .when([Compare::value(
            full,
            CompareOp::Equal,
            stored_value(owner, value_fence),
        )])
        .and_then([TxnOp::delete(full, None)])
}

/// Move to a new lease: while the grant's key (a lock key or a holder key) holds `owner`'s value on lease `old`, put it again on
/// lease `new`, its value now carrying `fence`; otherwise read it. Sent twice, the second
/// copy does nothing (the key is no longer on `old`).
pub(crate) fn move_txn(
    full: &[u8],
    owner: Owner,
    value_fence: Option<u64>,
    old: i64,
    fence: u64,
    new: i64,
) -> Txn {
    Txn::new()
        .when([
            Compare::value(full, CompareOp::Equal, stored_value(owner, value_fence)),
            Compare::lease(full, CompareOp::Equal, old),
        ])
        .and_then([TxnOp::put(
            full,
            stored_value(owner, Some(fence)),
            Some(PutOptions::new().with_lease(new)),
        )])
        .or_else([TxnOp::get(full, None)])
}

/// A lock key's value: the owner token, followed by `:` and the fence once the key was
/// moved to a new lease (that put changed the key's `mod_revision`, which is otherwise the
/// fence: the revision of the creation or of the hand-over that made this owner hold it).
pub(crate) fn stored_value(owner: Owner, value_fence: Option<u64>) -> String {
    match value_fence {
        None => owner.to_string(),
        Some(fence) => format!("{owner}:{fence}"),
    }
}

/// The holder a lock key's entry names, and its fence.
pub(crate) fn seen(kv: &KeyValue) -> Seen {
    let value = std::str::from_utf8(kv.value()).unwrap_or("");
    let (owner, fence) = match value.split_once(':') {
        Some((owner, fence)) => (owner, fence.parse().ok()),
        None => (value, None),
    };
    Seen {
        owner: Owner::parse(owner),
        lease: kv.lease(),
        fence: fence.unwrap_or_else(|| kv.mod_revision()),
    }
}

/// The current holder, read by the refused acquire transaction.
pub(crate) fn holder_in(response: &TxnResponse) -> Option<Seen> {
    response.op_responses().iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => get.kvs().first().map(seen),
        _ => None,
    })
}
