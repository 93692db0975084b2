//! Leaders' values of the in-process backend: per election, the value its holder published
//! (the `LeaderValues` impl in `lib.rs` checks the holder against the lock table).

use std::collections::HashMap;
use std::sync::Mutex;

use lock_core::sync::lock;
use lock_core::Owner;

/// Above this many kept values, a publication drops those whose holder is gone.
pub(crate) const PRUNE_AT: usize = 64;

/// A published value: the owner and term that published it, and the value.
type Published = (Owner, u64, Vec<u8>);

/// Each election's last published value.
#[derive(Default)]
pub(crate) struct Leaders {
    values: Mutex<HashMap<String, Published>>,
}

impl Leaders {
    /// Keeps `value` as `key`'s, published by `owner` in `term`; returns how many
    /// elections have a value kept.
    pub(crate) fn keep(&self, key: &str, owner: Owner, term: u64, value: &[u8]) -> usize {
        let mut values = lock(&self.values);
        values.insert(key.to_owned(), (owner, term, value.to_vec()));
        values.len()
    }

    /// The term and value `owner` published for `key`, if the value kept is its.
    pub(crate) fn of(&self, key: &str, owner: Owner) -> Option<(u64, Vec<u8>)> {
        lock(&self.values)
            .get(key)
            .filter(|(o, _, _)| *o == owner)
            .map(|(_, term, value)| (*term, value.clone()))
    }

    /// Drops the values whose publisher `holds` says no longer holds its election.
    pub(crate) fn prune(&self, holds: impl Fn(&str, Owner) -> bool) {
        let kept: Vec<(String, Owner)> = lock(&self.values)
            .iter()
            .map(|(k, (o, _, _))| (k.clone(), *o))
            .collect();
        for (key, owner) in kept {
            if !holds(&key, owner) {
                let mut values = lock(&self.values);
                if values.get(&key).is_some_and(|(o, _, _)| *o == owner) {
                    values.remove(&key);
                }
            }
        }
    }
}
