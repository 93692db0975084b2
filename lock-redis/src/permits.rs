//! Keys claimed with several permits (semaphores, reader-writer keys): `RedisNode`'s
//! operations on them. A lock (1 of 1) keeps the protocol of `node.rs`; the layout of the
//! other claims and their scripts are in `scripts/permits.rs`.

use std::time::{Duration, Instant};

use lock_core::{Attempt, Holder, Owner, Permits, Result, Ttl};
use redis::Value;

use crate::codec::{hex, integers, millis, text};
use crate::handle::RedisNode;
use crate::node::FENCE_RETENTION;
use crate::scripts::permits as scripts;

impl RedisNode {
    /// One attempt to take `permits` (not [`Permits::LOCK`]) of key `name` for `owner` for
    /// `ttl`: granted when the unexpired grants of the key leave `permits.take()` of its
    /// `permits.of()` free, with the key's next fence (from the counter its locks use too);
    /// taken otherwise, with the time until its earliest grant expires.
    ///
    /// # Errors
    /// [`Error::InvalidPermits`](lock_core::Error::InvalidPermits) when the key is held as
    /// a lock or with another number of permits; otherwise as [`ping`](Self::ping).
    pub(crate) async fn try_acquire_permits(
        &self,
        name: &str,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        let keys = [
            self.lock_key(name),
            self.holders_key(name),
            self.permits_key(name),
            self.fence_key(name),
            self.tombstone_key(name, owner),
        ];
        let op = "acquire_permits";
        let script = &scripts::ACQUIRE_PERMITS;
        self.grant_permits(script, op, name, &keys, &[hex(owner)], permits, ttl)
            .await
    }

    /// Passes the `permits` (not [`Permits::LOCK`]) that `from` holds of key `name`
    /// straight to `to` for `ttl`, with the key's next fence, if `from` still holds exactly
    /// that claim unexpired: one script, the permits never free in between (nothing is
    /// announced). `Taken` when `from` no longer holds them, or `to`'s attempt was
    /// abandoned; nothing changes then. Asked again after a lost reply, it grants `to`
    /// again with the same fence.
    ///
    /// # Errors
    /// As [`try_acquire_permits`](Self::try_acquire_permits); after an error the hand-over
    /// may or may not have happened.
    pub(crate) async fn hand_over_permits(
        &self,
        name: &str,
        from: Owner,
        to: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        let keys = [
            self.holders_key(name),
            self.permits_key(name),
            self.fence_key(name),
            self.tombstone_key(name, to),
        ];
        let (op, script) = ("hand_over_permits", &scripts::HAND_OVER_PERMITS);
        let owners = [hex(from), hex(to)];
        self.grant_permits(script, op, name, &keys, &owners, permits, ttl)
            .await
    }

    /// Runs a script that may grant `permits` of key `name` for `ttl` (the permits'
    /// acquire or hand-over): `keys`, then the `owners` (hex), take, of, TTL and the fence
    /// counter's retention; its answer read as one attempt whose validity counts from
    /// before the request.
    #[allow(clippy::too_many_arguments)]
    async fn grant_permits(
        &self,
        script: &crate::scripts::Script,
        op: &'static str,
        name: &str,
        keys: &[String],
        owners: &[[u8; 32]],
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        let ttl_ms = ttl.as_millis();
        let started = Instant::now();
        let reply = self
            .eval(script, op, |cmd| {
                cmd.arg(keys.len());
                for key in keys {
                    cmd.arg(key);
                }
                for owner in owners {
                    cmd.arg(&owner[..]);
                }
                cmd.arg(permits.take())
                    .arg(permits.of())
                    .arg(ttl_ms)
                    .arg(ttl_ms + millis(FENCE_RETENTION));
            })
            .await?;
        let numbers = integers(&reply, 2).map_err(|f| self.failure(op, f))?;
        self.attempt_reply(
            op,
            name,
            permits,
            started + ttl.get(),
            (numbers[0], numbers[1]),
        )
    }

    /// Pushes the expiry of `owner`'s permits of key `name` to `ttl` from now if it still
    /// holds them: `Some(valid_until)` (from the instant before the request), `None` when
    /// not held.
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub(crate) async fn extend_permits(
        &self,
        name: &str,
        owner: Owner,
        ttl: Ttl,
    ) -> Result<Option<Instant>> {
        let started = Instant::now();
        let (holders, permits) = (self.holders_key(name), self.permits_key(name));
        let owner = hex(owner);
        let reply = self
            .eval(&scripts::EXTEND_PERMITS, "extend_permits", |cmd| {
                cmd.arg(2)
                    .arg(&holders)
                    .arg(&permits)
                    .arg(&owner[..])
                    .arg(ttl.as_millis());
            })
            .await?;
        Ok(self
            .flag("extend_permits", reply)?
            .then(|| started + ttl.get()))
    }

    /// Gives back `owner`'s permits of key `name`, announcing the release on the channel
    /// when an attempt was refused meanwhile; `true` when they were held (unexpired),
    /// `false` otherwise (an expired grant of `owner` is removed all the same; no other
    /// owner's grant changes).
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub(crate) async fn release_permits(&self, name: &str, owner: Owner) -> Result<bool> {
        let (holders, permits) = (self.holders_key(name), self.permits_key(name));
        let notice = self.notice(name);
        let owner = hex(owner);
        let reply = self
            .eval(&scripts::RELEASE_PERMITS, "release_permits", |cmd| {
                cmd.arg(2)
                    .arg(&holders)
                    .arg(&permits)
                    .arg(&owner[..])
                    .arg(self.release_channel())
                    .arg(&notice);
            })
            .await?;
        self.flag("release_permits", reply)
    }

    /// Every unexpired grant of key `name`: its lock's holder (as
    /// [`inspect`](Self::inspect) tells it), or the holders of its permits, each with its
    /// owner token, fence, remaining time and permits.
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub(crate) async fn holders(&self, name: &str) -> Result<Vec<Holder>> {
        let keys = [
            self.lock_key(name),
            self.fence_key(name),
            self.holders_key(name),
            self.permits_key(name),
        ];
        let reply = self
            .eval(&scripts::HOLDERS, "inspect", |cmd| {
                cmd.arg(keys.len());
                for key in &keys {
                    cmd.arg(key);
                }
            })
            .await?;
        match &reply {
            Value::Array(items) => items
                .iter()
                .map(|item| holder(item).ok_or_else(|| self.unexpected("inspect", &reply)))
                .collect(),
            _ => Err(self.unexpected("inspect", &reply)),
        }
    }
}

/// One `{owner, pttl, fence, take, of}` of a [`scripts::HOLDERS`] reply.
fn holder(item: &Value) -> Option<Holder> {
    let Value::Array(fields) = item else {
        return None;
    };
    let [owner, Value::Int(pttl), fence, take, of] = fields.as_slice() else {
        return None;
    };
    let (owner, fence) = (text(owner)?, text(fence)?);
    let permits = text(take)?
        .parse()
        .ok()
        .zip(text(of)?.parse().ok())
        .and_then(|(take, of)| Permits::new(take, of).ok())
        .unwrap_or(Permits::LOCK);
    Some(
        Holder::new(
            Owner::parse(&owner),
            fence.parse().ok(),
            u64::try_from(*pttl).ok().map(Duration::from_millis),
        )
        .permits(permits),
    )
}
