//! Leaders' values of the in-process backend: per election, the value its holder published,
//! kept beside the lock table.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use async_trait::async_trait;
use lock_core::election::{Leader, LeaderValues};
use lock_core::sync::lock;
use lock_core::{Lease, Owner, Result};

use crate::MemoryBackend;

/// Above this many kept values, a publication drops those whose holder is gone.
const PRUNE_AT: usize = 64;

/// A published value: the owner and term that published it, and the value.
type Published = (Owner, u64, Vec<u8>);

/// Each election's last published value.
#[derive(Default)]
pub(crate) struct Leaders {
    values: Mutex<HashMap<String, Published>>,
}

impl MemoryBackend {
    /// The live grant of `key`'s holder, when one grant holds it: its owner, fence and validity.
    fn holder(&self, key: &str, now: Instant) -> Option<(Owner, u64, Instant)> {
        let (hash, shard) = self.shard(key);
        let entry = shard.entries.find(hash, |e| *e.key == *key)?;
        let mut live = entry.grants().filter(|g| g.valid_until > now);
        let g = live.next()?;
        Some((g.owner, g.fence, g.valid_until))
    }
}

#[async_trait]
impl LeaderValues for MemoryBackend {
    async fn publish(&self, lease: &Lease, value: &[u8]) -> Result<()> {
        let now = Instant::now();
        {
            // The table's shard stays locked until the value is kept: no release between.
            let (hash, shard) = self.shard(lease.key());
            let holds = shard
                .entries
                .find(hash, |e| *e.key == *lease.key())
                .is_some_and(|e| {
                    e.grants()
                        .any(|g| g.owner == lease.owner() && g.valid_until > now)
                });
            if !holds {
                return Err(lease.not_held());
            }
            let mut values = lock(&self.leaders.values);
            values.insert(
                lease.key().to_owned(),
                (lease.owner(), lease.fence(), value.to_vec()),
            );
            drop(shard);
            if values.len() > PRUNE_AT {
                drop(values);
                self.prune_leaders(now);
            }
        }
        self.notices.notify(lease.key());
        Ok(())
    }

    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        let now = Instant::now();
        let Some((owner, _, valid_until)) = self.holder(key, now) else {
            return Ok(None);
        };
        let values = lock(&self.leaders.values);
        Ok(values
            .get(key)
            .filter(|(o, _, _)| *o == owner)
            .map(|(o, term, value)| Leader::new(value.clone(), *term, *o, Some(valid_until - now))))
    }

    async fn announce(&self, key: &str) -> Result<()> {
        self.notices.notify(key);
        Ok(())
    }
}

impl MemoryBackend {
    /// Drops the values whose holder no longer holds its election.
    fn prune_leaders(&self, now: Instant) {
        let keys: Vec<(String, Owner)> = lock(&self.leaders.values)
            .iter()
            .map(|(k, (o, _, _))| (k.clone(), *o))
            .collect();
        for (key, owner) in keys {
            if self.holder(&key, now).is_none_or(|(o, _, _)| o != owner) {
                let mut values = lock(&self.leaders.values);
                if values.get(&key).is_some_and(|(o, _, _)| *o == owner) {
                    values.remove(&key);
                }
            }
        }
    }
}
