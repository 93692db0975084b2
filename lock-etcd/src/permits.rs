//! Keys claimed with several permits (semaphores, reader-writer keys): where their grants
//! live, the transactions that grant them, and what a refused transaction's reads decide.
//!
//! A lock (1 of 1) is the lock key itself (`<prefix><name>`, see `txn.rs`). Every other
//! grant is a **holder key** beside it, `<prefix><name>\xFF<owner>:<take>:<of>`, its value
//! the owner token as for a lock, on a lease of its own: a holder that stops renewing gives
//! its permits back at its TTL, as a lock does. The byte `0xFF` never occurs in UTF-8, so
//! the range of keys starting with `<prefix><name>\xFF` holds the holders of this name and
//! of no other.
//!
//! etcd cannot add up the holders' takes inside a transaction, so a grant is optimistic:
//! a transaction reads the lock key and the holder range at revision `R`; the next one
//! puts the holder key only if no holder key was created since (every key of the range has
//! a `create_revision` below `R + 1`) and no lock key exists, having checked from the reads
//! that the takes and this one fit within `of`. A holder key's name is its claim, so a key
//! that existed at `R` claims what was counted whatever happened to it since (a move to a
//! new lease rewrites it, keeping its creation), and deleted holders only free permits. The first
//! transaction of an attempt is the one for a free key (no lock key, no holder), so an
//! uncontended grant costs one transaction, as a lock does.

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp};
use etcd_client::{TxnOpResponse, TxnResponse};
use lock_core::{Error, Owner, Permits};

use crate::txn::{seen, Seen};

/// The byte between a lock key and the owner part of its holder keys.
const HOLDER_MARK: u8 = 0xFF;

/// How many transactions one attempt sends before it gives up on a key that keeps gaining
/// holders under it: with the transient [`Error::Unavailable`], after which the Locker
/// tries again with backoff, rather than racing on without bound.
pub(crate) const CONTENDED_ROUNDS: u32 = 8;

/// The start of the holder keys of lock key `full`: `full` then `0xFF`.
pub(crate) fn holders_of(full: &str) -> Vec<u8> {
    let mut start = Vec::with_capacity(full.len() + 1);
    start.extend_from_slice(full.as_bytes());
    start.push(HOLDER_MARK);
    start
}

/// The name part of a key under the prefix: everything before the holder mark, if any.
pub(crate) fn name_of(key: &[u8]) -> &[u8] {
    match key.iter().position(|&b| b == HOLDER_MARK) {
        Some(at) => &key[..at],
        None => key,
    }
}

/// The etcd key of a grant: the lock key `full` itself for a lock, the holder key
/// `full\xFF<owner>:<take>:<of>` for any other claim.
pub(crate) fn grant_key(full: &str, owner: Owner, permits: Permits) -> Vec<u8> {
    if permits == Permits::LOCK {
        return full.as_bytes().to_vec();
    }
    let mut key = holders_of(full);
    key.extend_from_slice(format!("{owner}:{}:{}", permits.take(), permits.of()).as_bytes());
    key
}

/// The claim a holder key names; `None` for a key under the range that is not one of ours.
fn claim_of(kv: &KeyValue) -> Option<Permits> {
    let at = kv.key().iter().position(|&b| b == HOLDER_MARK)?;
    let suffix = std::str::from_utf8(&kv.key()[at + 1..]).ok()?;
    let mut parts = suffix.split(':');
    let (_owner, take, of) = (parts.next()?, parts.next()?, parts.next()?);
    Permits::new(take.parse().ok()?, of.parse().ok()?).ok()
}

/// A holder key as read: the grant (owner, lease, fence), and its claim (`None`: a key
/// that is not one of ours, which is taken to hold every permit).
pub(crate) struct HolderSeen {
    pub(crate) seen: Seen,
    pub(crate) permits: Option<Permits>,
}

/// What a key's grants are, as one transaction read them: the lock key's holder and the
/// holder keys.
#[derive(Default)]
pub(crate) struct Grants {
    pub(crate) lock: Option<Seen>,
    pub(crate) holders: Vec<HolderSeen>,
}

impl Grants {
    /// The reads of a transaction whose operations (of the branch it took) are the
    /// lock key's, then the holder range's.
    pub(crate) fn read(response: &TxnResponse) -> Grants {
        let mut gets = response
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get),
                _ => None,
            });
        let lock = gets.next().and_then(|get| get.kvs().first().map(seen));
        let holders = gets
            .next()
            .map(|get| {
                get.kvs()
                    .iter()
                    .map(|kv| HolderSeen {
                        seen: seen(kv),
                        permits: claim_of(kv),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Grants { lock, holders }
    }

    /// Every grant seen, the lock's and the holders'.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Seen> {
        self.lock.iter().chain(self.holders.iter().map(|h| &h.seen))
    }
}

/// The reads every acquire transaction makes when refused: the lock key, the holder range.
pub(crate) fn read_grants(full: &str) -> [TxnOp; 2] {
    [
        TxnOp::get(full, None),
        TxnOp::get(holders_of(full), Some(GetOptions::new().with_prefix())),
    ]
}

/// Whether key `full` is free: no lock key and no holder key.
pub(crate) fn free(full: &str) -> [Compare; 2] {
    [
        Compare::create_revision(full, CompareOp::Equal, 0),
        // Over a range: true only when every key of it (there is none) was never created.
        Compare::create_revision(holders_of(full), CompareOp::Equal, 0).with_prefix(),
    ]
}

/// Put `key` (a lock key or a holder key) with `value` on `lease`.
fn put(key: Vec<u8>, value: &str, lease: i64) -> TxnOp {
    TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease)))
}

/// A claim of `permits` (not a lock) by `owner` on lock key `full`, and its transactions.
pub(crate) struct Claim<'a> {
    pub(crate) full: &'a str,
    pub(crate) permits: Permits,
    key: Vec<u8>,
    value: String,
}

/// What the reads of a refused transaction decide.
pub(crate) enum Next {
    /// Not enough permits free: the attempt is refused.
    Taken,
    /// Never grantable as the key is held: the claim's error.
    Refused(Error),
    /// The permits fit as the reads saw them: this transaction takes them unless a holder
    /// changed since.
    Again(Txn),
}

impl<'a> Claim<'a> {
    pub(crate) fn new(full: &'a str, owner: Owner, permits: Permits) -> Self {
        Claim {
            full,
            permits,
            key: grant_key(full, owner, permits),
            value: owner.to_string(),
        }
    }

    /// The first transaction of an attempt: if the key is free, put the grant on `lease`;
    /// otherwise read the key's grants. For a lock this is the whole protocol (a lock is
    /// granted on a free key only, so a lock and permits on one key exclude each other).
    pub(crate) fn first(&self, lease: i64) -> Txn {
        Txn::new()
            .when(free(self.full))
            .and_then([put(self.key.clone(), &self.value, lease)])
            .or_else(read_grants(self.full))
    }

    /// The transaction after reads at revision `read` that left the permits free: put the
    /// grant on `lease` while no lock key exists and no holder key was created since
    /// `read`; otherwise read the key's grants again.
    fn after(&self, read: i64, lease: i64) -> Txn {
        let holders = holders_of(self.full);
        Txn::new()
            .when([
                Compare::create_revision(self.full, CompareOp::Equal, 0),
                Compare::create_revision(holders, CompareOp::Less, read.saturating_add(1))
                    .with_prefix(),
            ])
            .and_then([put(self.key.clone(), &self.value, lease)])
            .or_else(read_grants(self.full))
    }

    /// What refused reads of `grants` at revision `read` decide for this claim on key
    /// `name`, with the next transaction on `lease`.
    pub(crate) fn next(&self, name: &str, grants: &Grants, read: i64, lease: i64) -> Next {
        let refuse = |reason: String| Next::Refused(Error::InvalidPermits { reason });
        let of = self.permits.of();
        if self.permits == Permits::LOCK {
            return match (&grants.lock, grants.holders.first()) {
                (Some(_), _) => Next::Taken,
                (None, Some(_)) => refuse(format!(
                    "key {name:?} is held with several permits (a semaphore or a \
                     reader-writer key), not as a lock"
                )),
                // Freed between the transactions: try the free key again.
                (None, None) => Next::Again(self.first(lease)),
            };
        }
        if grants.lock.is_some() {
            return refuse(format!(
                "key {name:?} is held as a lock, not with {of} permits"
            ));
        }
        let mut taken = u64::from(self.permits.take());
        for holder in &grants.holders {
            match holder.permits {
                Some(held) if held.of() != of => {
                    return refuse(format!(
                        "key {name:?} is held with {} permits, not {of}",
                        held.of()
                    ))
                }
                Some(held) => taken += u64::from(held.take()),
                None => return Next::Taken,
            }
        }
        if taken > u64::from(of) {
            return Next::Taken;
        }
        Next::Again(if grants.holders.is_empty() {
            self.first(lease)
        } else {
            self.after(read, lease)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(owner: u128, permits: Option<Permits>) -> HolderSeen {
        HolderSeen {
            seen: Seen {
                owner: Some(Owner::from_u128(owner)),
                lease: 7,
                fence: 3,
            },
            permits,
        }
    }

    fn decide(claim: Permits, grants: &Grants) -> Next {
        Claim::new("p/k", Owner::random(), claim).next("k", grants, 10, 7)
    }

    fn refusal(next: Next) -> String {
        match next {
            Next::Refused(Error::InvalidPermits { reason }) => reason,
            Next::Refused(e) => panic!("refused with {e}"),
            Next::Taken => panic!("taken"),
            Next::Again(_) => panic!("again"),
        }
    }

    /// The reads of a refused transaction decide: a lock and permits refuse each other, as
    /// do claims of another `of`; permits that do not fit are taken; permits that fit go
    /// again (conditional on no new holder), and so does a key found free.
    #[test]
    fn refused_reads_decide_the_next_step() {
        let one_of_three = Permits::new(1, 3).unwrap();
        let two_of_three = Permits::new(2, 3).unwrap();
        let locked = Grants {
            lock: Some(held(1, None).seen),
            holders: Vec::new(),
        };
        assert!(matches!(decide(Permits::LOCK, &locked), Next::Taken));
        let reason = refusal(decide(one_of_three, &locked));
        assert!(
            reason.contains("held as a lock, not with 3 permits"),
            "{reason}"
        );
        let semaphore = Grants {
            lock: None,
            holders: vec![held(1, Some(one_of_three)), held(2, Some(one_of_three))],
        };
        let reason = refusal(decide(Permits::LOCK, &semaphore));
        assert!(reason.contains("not as a lock"), "{reason}");
        let reason = refusal(decide(Permits::new(1, 4).unwrap(), &semaphore));
        assert!(reason.contains("held with 3 permits, not 4"), "{reason}");
        assert!(matches!(decide(one_of_three, &semaphore), Next::Again(_)));
        assert!(matches!(decide(two_of_three, &semaphore), Next::Taken));
        // A key under the range that is not one of ours is taken to hold every permit.
        let foreign = Grants {
            lock: None,
            holders: vec![held(1, None)],
        };
        assert!(matches!(decide(one_of_three, &foreign), Next::Taken));
        // Readers share; a writer is alone.
        let reader = Grants {
            lock: None,
            holders: vec![held(1, Some(Permits::read()))],
        };
        assert!(matches!(decide(Permits::read(), &reader), Next::Again(_)));
        assert!(matches!(decide(Permits::write(), &reader), Next::Taken));
        for claim in [Permits::LOCK, one_of_three, Permits::write()] {
            assert!(matches!(decide(claim, &Grants::default()), Next::Again(_)));
        }
    }

    #[test]
    fn holder_keys_sit_beside_their_lock_key_only() {
        let owner = Owner::random();
        let lock = grant_key("p/a", owner, Permits::LOCK);
        assert_eq!(lock, b"p/a");
        let holder = grant_key("p/a", owner, Permits::new(2, 3).unwrap());
        assert!(holder.starts_with(&holders_of("p/a")));
        assert_eq!(name_of(&holder), b"p/a");
        assert_eq!(name_of(b"p/a"), b"p/a");
        // No UTF-8 name sorts into another name's holder range.
        assert!(!holders_of("p/a").starts_with("p/aé".as_bytes()));
        assert!(!"p/aé".as_bytes().starts_with(&holders_of("p/a")));
    }
}
