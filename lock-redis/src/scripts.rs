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

/// Lua helpers of the "awaited" mark. A refused attempt marks the lock it was refused by
/// as awaited, by appending `*` to the holder's owner token (32 hex digits, so a token
/// never ends in `*` and a foreign value is never marked); the mark lives exactly as long as
/// the lock. A release announces itself only when its lock was awaited: an uncontended
/// cycle publishes nothing, so no subscriber anywhere is woken for it. `mine(v, owner)` is
/// whether the value `v` is `owner`'s lock, marked or not.
macro_rules! awaited_helpers {
    () => {
        r#"
local function awaited(v)
  return type(v) == 'string' and string.byte(v, -1) == 42
end
local function mine(v, owner)
  return v == owner or v == owner .. '*'
end
"#
    };
}

/// The next fence of a lock whose fence counter is `counter` (see [`ACQUIRE`]), into
/// `fence` (a local the caller declares), reading the server's clock once per script into
/// the script's local `clock` (one reading serves every lock of a group):
/// `max(counter + 1, server TIME in µs)`, written back to the counter, which is then kept
/// for `retention` ms from this grant. The time is read in whole milliseconds (still
/// counted in µs): nodes of a Redlock that grant in the same millisecond, with their
/// counters in step, then issue the SAME token, which needs no write-back round trip. When
/// the write is refused (e.g. `OOM`), `fence` is `false` and `err` (also the caller's
/// local) says why.
///
/// The counter is read with a plain `GET` and written with a plain `SET … PX`, inside the
/// same atomic step: both exist on every Redis distlock accepts (5.0 and newer), so fences
/// strictly increase the same way on every version (`SET … GET`, one command fewer, exists
/// only from 6.2). A counter that is not a number, or of a foreign type (which `GET`
/// refuses), counts as missing and is overwritten.
macro_rules! next_fence {
    () => {
        r#"
    if not clock then
      local now = redis.call('TIME')
      clock = tonumber(now[1]) * 1000000 + math.floor(tonumber(now[2]) / 1000) * 1000
    end
    fence = clock
    local last = redis.pcall('GET', counter)
    last = type(last) == 'string' and tonumber(last)
    if last and last >= fence then fence = last + 1 end
    local written = redis.pcall('SET', counter, string.format('%d', fence), 'PX', retention)
    if type(written) == 'table' and written.err then fence, err = false, written.err end
"#
    };
}

/// The fence of the holder of a lock that asks again (a request re-sent after a lost
/// reply), into `fence`: the counter (the last fence issued), or a new fence as
/// [`next_fence`] makes when the counter is gone or not a number.
macro_rules! current_fence {
    () => {
        concat!(
            r#"
    fence = redis.pcall('GET', counter)
    fence = type(fence) == 'string' and tonumber(fence)
    if not fence then
"#,
            next_fence!(),
            r#"
    end
"#
        )
    };
}

/// Lua helpers of the permits of a key (see [`ACQUIRE_PERMITS`] for the layout), for the
/// permits scripts and [`ABANDON`]. Every time is the server's, in whole milliseconds: the
/// scripts read `TIME` themselves (`server_clock()`, in µs rounded down to the ms as
/// [`next_fence`] reads it), so every client's grants expire on the one clock that also
/// expires the keys. `ms(n)` writes a number for a command without Lua's exponent notation.
///
/// - `forget(permits, owner)` removes `owner`'s grant from the permits hash, its `take`
///   leaving the `taken` count;
/// - `prune(holders, permits, now_ms)` drops the grants expired at `now_ms` (a score below
///   `now_ms`; true when a grant is left, otherwise both keys are gone), reading only the
///   earliest grant when none has expired (one call on the path of every grant). Not at `now_ms`
///   itself: `now_ms` is the time rounded down, so a grant whose expiry equals it may have
///   up to a millisecond left for its holder, whose validity counts from before the
///   request; Redis expires a key the same way (only once its time is past);
/// - `keep_until_latest(holders, permits)` sets both keys to expire with the latest grant
///   (`PEXPIREAT` its expiry), so that a key whose holders all vanished goes by itself;
/// - `let_go(holders, permits, owner, channel, notice, now_ms)` removes `owner`'s grant
///   (which the caller found in `holders`), announces the release when a refused attempt
///   marked the key awaited (and clears the mark: an attempt refused later marks it again),
///   and prunes; the last grant to go deletes the permits hash with it, without counting
///   its permits out first.
///
/// [`ACQUIRE_PERMITS`]: permits::ACQUIRE_PERMITS
macro_rules! permits_helpers {
    () => {
        r#"
local function server_clock()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000000 + math.floor(tonumber(now[2]) / 1000) * 1000
end
local function ms(n) return string.format('%d', n) end
local function forget(permits, owner)
  local grant = redis.call('HGET', permits, owner)
  local take = grant and tonumber(string.match(grant, '^%d+'))
  if take then redis.call('HINCRBY', permits, 'taken', -take) end
  redis.call('HDEL', permits, owner)
end
local function prune(holders, permits, now_ms)
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  if #first == 0 then
    redis.call('DEL', permits)
    return false
  end
  if tonumber(first[2]) >= now_ms then return true end
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', '(' .. ms(now_ms))
  for _, owner in ipairs(gone) do forget(permits, owner) end
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', '(' .. ms(now_ms))
  if redis.call('EXISTS', holders) == 1 then return true end
  redis.call('DEL', permits)
  return false
end
local function keep_until_latest(holders, permits)
  local latest = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')
  if #latest == 0 then
    redis.call('DEL', permits)
    return
  end
  local at = ms(tonumber(latest[2]))
  redis.call('PEXPIREAT', holders, at)
  redis.call('PEXPIREAT', permits, at)
end
local function let_go(holders, permits, owner, channel, notice, now_ms)
  redis.call('ZREM', holders, owner)
  if redis.call('HDEL', permits, 'awaited') == 1 then redis.call('PUBLISH', channel, notice) end
  if redis.call('EXISTS', holders) == 0 then
    redis.call('DEL', permits)
    return
  end
  forget(permits, owner)
  if prune(holders, permits, now_ms) then keep_until_latest(holders, permits) end
end
"#
    };
}

/// The answer of lock `i` of a grouped script into `out` (a `flag, value` pair): `flag,
/// value` when the script set `flag` (taken, abandoned, held with permits), `1, fence` when
/// granted, else `-1` and the server's error `err`.
macro_rules! answer {
    () => {
        r#"
  if flag then
    out[2 * i - 1], out[2 * i] = flag, value
  elseif fence then
    out[2 * i - 1], out[2 * i] = 1, fence
  else
    out[2 * i - 1], out[2 * i] = -1, tostring(err)
  end
"#
    };
}

/// Take locks if free, for one caller or a group of them. KEYS: lock, fence counter,
/// tombstone of the owner, holders of the key's permits ([`ACQUIRE_PERMITS`]), for each
/// lock. ARGV: owner, ttl ms, counter retention ms, for each lock. Returns, for each lock
/// in order, `1, fence` when granted, `0, pttl` when
/// taken (also when the owner's tombstone exists: the attempt was abandoned, see
/// [`ABANDON`]), `-2, 0` when the key is held as permits (a semaphore or a reader-writer
/// key: a lock there is an invalid claim), and `-1, message` when
/// the server refused an operation on that lock's keys (e.g. `WRONGTYPE`: a foreign value
/// of another type at the lock key). Asking again with the owner that holds the lock
/// grants it again with the same fence and a fresh TTL, so a request re-sent after a lost
/// reply cannot leave an orphaned lock.
///
/// Each lock's commands go through `redis.pcall`, so an error on one lock is that lock's
/// answer and never aborts the script half-way (which would leave the grants already
/// written for the earlier locks of a group, with nobody told): every caller of a group
/// gets the answer it would have got alone. A lock whose fence cannot be written is not
/// left granted (its key is deleted again).
///
/// Every grant's fence is `max(counter + 1, server TIME in µs, rounded down to the ms)`, written back to the
/// counter with a fresh retention (the lock's TTL plus [`FENCE_RETENTION`]). The counter
/// orders grants whatever the clock does; the clock orders them when the counter is
/// missing (expired, lost with a restart) or STALE (an RDB snapshot, AOF `everysec` or an
/// async replica brought back an older value): a token is never above the server time of
/// its grant by more than the grants of the key within one microsecond, so a later clock
/// reading exceeds every earlier token unless the clock went back. A counter that is not a
/// number (a foreign value) counts as missing and is overwritten. Numbers stay below 2^53,
/// where Lua's doubles are exact; `%d` writes them without the exponent notation
/// `tostring` would use.
///
/// The tombstone and the permits' holders are looked up with ONE `EXISTS` of both keys:
/// a lock's attempt costs no more commands than before permits existed, and only when
/// one of them exists does a second `EXISTS` tell which.
///
/// [`FENCE_RETENTION`]: crate::FENCE_RETENTION
/// [`ACQUIRE_PERMITS`]: permits::ACQUIRE_PERMITS
pub(crate) static ACQUIRE: Script = Script::new(concat!(
    // Lean by measurement: the granted path runs straight through (no helper closures, no
    // extra table lookups), since every `redis.call` and every Lua allocation is paid on
    // each grant; the refused and repeated paths follow it.
    r#"
local clock
local out = {}
for i = 1, #KEYS / 4 do
  local lock, counter = KEYS[4 * i - 3], KEYS[4 * i - 2]
  local owner, ttl, retention = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  local fence, err, flag, value
  local blocked = redis.pcall('EXISTS', KEYS[4 * i - 1], KEYS[4 * i])
  local set = blocked == 0 and redis.pcall('SET', lock, owner, 'NX', 'PX', ttl)
  if set and set.ok then
"#,
    next_fence!(),
    r#"
    if not fence then redis.pcall('DEL', lock) end
  elseif blocked ~= 0 then
    -- Abandoned (the owner's tombstone), or held with permits.
    if redis.pcall('EXISTS', KEYS[4 * i - 1]) == 1 then
      flag, value = 0, redis.pcall('PTTL', lock)
    else
      flag, value = -2, 0
    end
  elseif set then
    err = set.err
  else
    local holder = redis.pcall('GET', lock)
    if type(holder) == 'table' then
      err = holder.err
    elseif holder == owner or holder == owner .. '*' then
      -- Refused on a replica (READONLY): the grant is not renewed, so it is not granted.
      local pushed = redis.pcall('PEXPIRE', lock, ttl)
      if type(pushed) == 'table' then
        err = pushed.err
      else
"#,
    current_fence!(),
    r#"
        if not fence then redis.pcall('DEL', lock) end
      end
    else
      if type(holder) == 'string' and #holder == 32 then redis.pcall('APPEND', lock, '*') end
      flag, value = 0, redis.pcall('PTTL', lock)
    end
  end
"#,
    answer!(),
    r#"
end
return out
"#
));

/// Pass locks straight from their holders to the next owners, with new fences, for one
/// caller or a group of them (as [`ACQUIRE`] groups grants). KEYS: lock, fence counter,
/// tombstone of the next owner, for each lock. ARGV: holder, next owner, ttl ms, counter
/// retention ms, for each lock. Returns, for each lock in order, `1, fence` when handed
/// over, `0, pttl` when the holder no longer holds it or the next owner's attempt was
/// abandoned ([`ABANDON`]; nothing changes then), and `-1, message` when the server refused
/// an operation on that lock's keys. Asked again after a lost reply (the next owner holds
/// it already), it answers as [`ACQUIRE`] does: the same fence, a fresh TTL. When the new
/// fence cannot be written (e.g. `OOM`), the hand-over is undone (the holder keeps the
/// lock, the next owner holds nothing) and the error is that lock's answer. Each lock's
/// commands go through `redis.pcall`, so an error on one never aborts another's.
pub(crate) static HAND_OVER: Script = Script::new(concat!(
    r#"
local clock
local out = {}
for i = 1, #KEYS / 3 do
  local lock, counter = KEYS[3 * i - 2], KEYS[3 * i - 1]
  local from, to = ARGV[4 * i - 3], ARGV[4 * i - 2]
  local ttl, retention = ARGV[4 * i - 1], ARGV[4 * i]
  local fence, err, flag, value
  local holder = redis.pcall('EXISTS', KEYS[3 * i]) == 0 and redis.pcall('GET', lock)
  if type(holder) == 'table' then
    err = holder.err
  elseif holder and (holder == from or holder == from .. '*') then
    local left = redis.pcall('PTTL', lock)
    -- Waiters elsewhere still wait: the mark passes to the next owner.
    local set = redis.pcall('SET', lock, holder == from and to or to .. '*', 'PX', ttl)
    if set.err then
      err = set.err
    else
"#,
    next_fence!(),
    r#"
      if not fence then
        -- Undo: the holder keeps its lock, `to` gets nothing.
        if type(left) == 'number' and left > 0 then
          redis.pcall('SET', lock, holder, 'PX', left)
        else
          redis.pcall('SET', lock, holder)
        end
      end
    end
  elseif holder and (holder == to or holder == to .. '*') then
    local pushed = redis.pcall('PEXPIRE', lock, ttl)
    if type(pushed) == 'table' then
      err = pushed.err
    else
"#,
    current_fence!(),
    r#"
      if not fence then redis.pcall('DEL', lock) end
    end
  else
    -- Abandoned (the next owner's tombstone), or no longer the holder's.
    flag, value = 0, redis.pcall('PTTL', lock)
  end
"#,
    answer!(),
    r#"
end
return out
"#
));

/// Push the expiry if the lock is still ours. KEYS: lock. ARGV: owner, ttl ms. Returns 1 or 0.
pub(crate) static EXTEND: Script = Script::new(concat!(
    awaited_helpers!(),
    r#"
if mine(redis.call('GET', KEYS[1]), ARGV[1]) then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#
));

/// Delete locks that are still ours and announce the release of each awaited one (see
/// [`awaited_helpers`]), for one caller or a group.
/// KEYS: the locks. ARGV: channel, then owner and notice for each lock. Returns, for each
/// lock in order, 1 when deleted, 0 when it was not ours (then nothing changes), and an
/// error message (a string) when the server refused to read or delete that lock's key (e.g.
/// `WRONGTYPE`). As in [`ACQUIRE`], `redis.pcall` keeps an error on one lock from
/// aborting the others' releases.
pub(crate) static RELEASE: Script = Script::new(
    // Lean as ACQUIRE is: the plain, unawaited release is a GET and a DEL.
    r#"
local out = {}
for i = 1, #KEYS do
  local holder = redis.pcall('GET', KEYS[i])
  local owner = ARGV[2 * i]
  local awaited = holder ~= owner and holder == owner .. '*'
  if holder == owner or awaited then
    local deleted = redis.pcall('DEL', KEYS[i])
    if type(deleted) == 'table' then
      -- Refused on a replica (READONLY): nothing was released.
      out[i] = tostring(deleted.err)
    else
      if awaited then redis.pcall('PUBLISH', ARGV[1], ARGV[2 * i + 1]) end
      out[i] = 1
    end
  elseif type(holder) == 'table' then
    out[i] = tostring(holder.err)
  else
    out[i] = 0
  end
end
return out
"#,
);

/// Forget an attempt whose answer never came. KEYS: lock, tombstone of the owner, holders
/// and permits of the key ([`ACQUIRE_PERMITS`]). ARGV: owner, channel, notice, tombstone
/// retention ms. Writes the tombstone (so that the attempt, should it still arrive, is
/// refused by [`ACQUIRE`], [`HAND_OVER`], [`ACQUIRE_PERMITS`] or [`HAND_OVER_PERMITS`]),
/// then deletes the lock if the owner holds it, or removes the owner's permits (it was
/// granted), announcing it when it was awaited. Returns 1 when a grant was removed, 0 otherwise. The tombstone is
/// written in both cases: a request can have been sent twice (re-sent on a new connection
/// after the first looked lost).
///
/// The retention is the abandoning handle's operation timeout times
/// [`ABANDON_TIMEOUTS`](crate::ABANDON_TIMEOUTS) (at least 1 s, at most 10 minutes): the
/// tombstone lives while the abandoned request can still arrive from a connection that
/// stalled for less than that many timeouts; one arriving later can only grant a lock no
/// one believes it holds, which blocks the key for the attempt's TTL at most (see
/// `RedisNode::abandon_retention` for the reasoning).
///
/// [`ACQUIRE_PERMITS`]: permits::ACQUIRE_PERMITS
/// [`HAND_OVER_PERMITS`]: permits::HAND_OVER_PERMITS
pub(crate) static ABANDON: Script = Script::new(concat!(
    awaited_helpers!(),
    permits_helpers!(),
    r#"
redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
local holder = redis.pcall('GET', KEYS[1])
if mine(holder, ARGV[1]) then
  redis.call('DEL', KEYS[1])
  if awaited(holder) then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
  return 1
end
-- A foreign value at the holders' key (WRONGTYPE) holds no permits of ours.
if type(redis.pcall('ZSCORE', KEYS[3], ARGV[1])) == 'string' then
  let_go(KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], server_clock() / 1000)
  return 1
end
return 0
"#
));

/// Delete the key's grants whoever holds them (the lock, or every holder of its permits)
/// and announce it. KEYS: lock, holders and permits of the key. ARGV: channel, notice.
/// Returns 1 when anything was deleted, 0 otherwise.
pub(crate) static FORCE_RELEASE: Script = Script::new(
    r#"
local n = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('PUBLISH', ARGV[1], ARGV[2])
if n > 0 then return 1 end
return 0
"#,
);

/// The holder, if any. KEYS: lock, fence counter. Returns nil, or `{owner, pttl, fence}`
/// (the owner without its awaited mark).
pub(crate) static INSPECT: Script = Script::new(
    r#"
local owner = redis.call('GET', KEYS[1])
if not owner then return false end
if string.byte(owner, -1) == 42 then owner = string.sub(owner, 1, -2) end
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

pub(crate) mod leaders;
pub(crate) mod permits;
pub(crate) mod schedule;
