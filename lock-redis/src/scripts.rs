//! The Lua scripts of the single-node protocol.
//!
//! Every script is one atomic step on the server, so no other client can act between its
//! reads and writes. Keys are always passed in `KEYS` (never built inside a script) so that
//! the lock key and its fence counter, which share a hash tag, can live on one cluster slot.

use std::sync::OnceLock;

/// A script's source and its SHA1, for `EVALSHA` with an `EVAL` fallback.
pub(crate) struct Script {
    pub(crate) source: &'static str,
    sha: OnceLock<String>,
}

impl Script {
    const fn new(source: &'static str) -> Self {
        Script {
            source,
            sha: OnceLock::new(),
        }
    }

    pub(crate) fn sha(&self) -> &str {
        self.sha
            .get_or_init(|| redis::Script::new(self.source).get_hash().to_owned())
    }
}

/// Take the lock if free. KEYS: lock, fence counter. ARGV: owner, ttl ms, counter retention
/// ms. Returns `{1, fence}` when granted, `{0, pttl}` when taken. Asking again with the
/// owner that holds the lock grants it again with the same fence and a fresh TTL, so a
/// request re-sent after a lost reply cannot leave an orphaned lock.
///
/// The fence is the counter plus one while the counter lives (`INCR` keeps its expiry);
/// otherwise the server time in µs, which starts a new counter kept for the retention. The
/// counter orders grants whatever the clock does; the clock orders them across a lost or
/// expired counter, because a counter that started at time `t` and served `k` grants holds
/// `t + k`, below the time of its last grant. `INCR` answering 1 means the counter was
/// missing (a live counter is never 0); `pcall` turns a non-numeric counter into a restart
/// from the clock instead of an error. Numbers stay below 2^53, where Lua's doubles are
/// exact; `%d` writes them without the exponent notation `tostring` would use.
pub(crate) static ACQUIRE: Script = Script::new(
    r#"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(redis.call('GET', KEYS[2])) or 0}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
local fence = redis.pcall('INCR', KEYS[2])
if type(fence) ~= 'number' or fence == 1 then
  local now = redis.call('TIME')
  fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[3])
end
return {1, fence}
"#,
);

/// Push the expiry if the lock is still ours. KEYS: lock. ARGV: owner, ttl ms. Returns 1 or 0.
pub(crate) static EXTEND: Script = Script::new(
    r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#,
);

/// Delete the lock if it is still ours and announce it. KEYS: lock. ARGV: owner, channel,
/// notice. Returns 1 or 0.
pub(crate) static RELEASE: Script = Script::new(
    r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
"#,
);

/// Delete the lock whoever holds it and announce it. KEYS: lock. ARGV: channel, notice.
/// Returns the number of keys deleted.
pub(crate) static FORCE_RELEASE: Script = Script::new(
    r#"
local n = redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return n
"#,
);

/// The holder, if any. KEYS: lock, fence counter. Returns nil, or `{owner, pttl, fence}`.
pub(crate) static INSPECT: Script = Script::new(
    r#"
local owner = redis.call('GET', KEYS[1])
if not owner then return false end
return {owner, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or ''}
"#,
);

/// Raise the fence counter to at least ARGV[1]. KEYS: fence counter. ARGV: fence (decimal),
/// retention ms. Returns 1 when raised, 0 when it was already at least that.
pub(crate) static RAISE_FENCE: Script = Script::new(
    r#"
local last = tonumber(redis.call('GET', KEYS[1]))
if last and last >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"#,
);
