//! The Lua scripts of keys with several permits: semaphores (k of N) and reader-writer keys
//! (a reader takes 1 of [`RW_PERMITS`](lock_core::RW_PERMITS), a writer all of them).
//!
//! A lock (1 of 1) stays the plain string of [`ACQUIRE`](super::ACQUIRE); a key claimed
//! with several permits lives in two keys beside it, both under the lock's hash tag:
//!
//! - **holders** `<lock key>:holders`, a sorted set: each grant's owner token (32 hex
//!   digits) scored by its expiry in the server's milliseconds;
//! - **permits** `<lock key>:permits`, a hash: `of` (the key's permits, as its holders
//!   claim them), `taken` (the permits the grants in `holders` take together), `awaited`
//!   (present when an attempt was refused since the last release), and for each grant's
//!   owner token `"<take> <fence>"`.
//!
//! Both keys expire with the latest grant (`PEXPIREAT`), every script drops the grants
//! expired by the server's clock before it counts, and the last grant to go deletes both,
//! so nothing stays behind. A key is never held as a lock and with permits at once: each
//! acquire refuses the other kind while it is held (the permits script answers `-2`; so
//! does [`ACQUIRE`](super::ACQUIRE)).
//!
//! A holder's grant passes to the Locker's next waiter of the same claim in one step
//! ([`HAND_OVER_PERMITS`]), as a lock does ([`HAND_OVER`](super::HAND_OVER)).

use super::Script;

/// Take `take` of a key's `of` permits if they are free. KEYS: lock, holders, permits,
/// fence counter, tombstone of the owner. ARGV: owner, take, of, ttl ms, counter retention
/// ms. Returns `1, fence` when granted; `0, pttl` when taken (the time until the earliest
/// grant expires, `-2` when there is none), which marks the key awaited, and also when the
/// owner's tombstone exists (the attempt was abandoned, see [`ABANDON`](super::ABANDON));
/// `-2, of` when the key is held as a lock (`of` 1) or with another number of permits.
///
/// Granted when the permits taken by the unexpired grants and `take` add up to at most
/// `of`, with the key's next fence from the same counter as its locks (`next_fence`), so
/// fences strictly increase across every grant of the key, whatever it claims. Asking
/// again with an owner that holds permits (a request re-sent after a lost reply) grants
/// them again with the same fence and a fresh TTL. The fence counter is written before
/// the grant: when it is refused (e.g. `OOM`), no grant is written and the error is the
/// script's (as is any other refused write, e.g. `READONLY` on a demoted master, where
/// nothing was written).
pub(crate) static ACQUIRE_PERMITS: Script = Script::new(concat!(
    permits_helpers!(),
    r#"
local lock, holders, permits, counter, tombstone = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, take, of, ttl, retention =
  ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local clock = server_clock()
local now_ms = clock / 1000
local function first_free()
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  if #first == 0 then return -2 end
  return math.max(tonumber(first[2]) - now_ms, 0)
end
-- One call on the path of a grant: neither the owner's tombstone nor the lock is there.
if redis.call('EXISTS', tombstone, lock) > 0 then
  if redis.call('EXISTS', tombstone) == 1 then return {0, first_free()} end
  return {-2, 1}
end
local live = prune(holders, permits, now_ms)
local expiry = ms(now_ms + ttl)
local taken = 0
if live then
  local kept, grant, counted = unpack(redis.call('HMGET', permits, 'of', owner, 'taken'))
  kept = tonumber(kept)
  -- Holders without the key's permits (the hash was lost apart from them, e.g. evicted):
  -- nothing is granted until they expire.
  if not kept then return {0, first_free()} end
  if kept ~= of then return {-2, kept} end
  local fence = grant and tonumber(string.match(grant, ' (%d+)$'))
  if fence then
    redis.call('ZADD', holders, expiry, owner)
    keep_until_latest(holders, permits)
    return {1, fence}
  end
  taken = tonumber(counted) or 0
  if taken + take > of then
    redis.call('HSET', permits, 'awaited', '1')
    return {0, first_free()}
  end
end
local fence, err
"#,
    next_fence!(),
    r#"
if not fence then return redis.error_reply(tostring(err)) end
redis.call('ZADD', holders, expiry, owner)
redis.call('HSET', permits, 'of', ARGV[3], owner, ARGV[2] .. ' ' .. ms(fence),
  'taken', ms(taken + take))
if live then
  keep_until_latest(holders, permits)
else
  -- The only grant: both keys expire with it.
  redis.call('PEXPIREAT', holders, expiry)
  redis.call('PEXPIREAT', permits, expiry)
end
return {1, fence}
"#
));

/// Pass a holder's permits straight to the next owner, with a new fence. KEYS: holders,
/// permits, fence counter, tombstone of the next owner. ARGV: holder, next owner, take,
/// of, ttl ms, counter retention ms. Returns `1, fence` when handed over; `0, pttl` (as
/// [`ACQUIRE_PERMITS`] answers a refusal, without marking the key awaited) when the holder
/// no longer holds an unexpired grant of exactly `take` of `of`, or when the next owner's
/// attempt was abandoned (its tombstone exists, see [`ABANDON`](super::ABANDON)); nothing
/// of the grants changes then.
///
/// One atomic step, the lock's [`HAND_OVER`](super::HAND_OVER) for permits: the holder's
/// member and hash entry go, and the next owner's come with the same `take`, an expiry of
/// `ttl` from the server's clock and the next fence of the key's one counter
/// (`next_fence`), so fences strictly increase across the hand-over as across every grant
/// of the key. The permits never become free in between: `taken` is unchanged, nothing is
/// published, and the `awaited` mark stays for waiters elsewhere (as the lock's mark
/// passes to its next owner). The fence counter is written first: when it is refused
/// (e.g. `OOM`), the holder keeps its grant, the next owner gets nothing, and the error is
/// the script's. Asked again after a lost reply (the next owner holds the permits
/// already), it answers as [`ACQUIRE_PERMITS`] does: the same fence, a fresh TTL.
pub(crate) static HAND_OVER_PERMITS: Script = Script::new(concat!(
    permits_helpers!(),
    r#"
local holders, permits, counter, tombstone = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local from, to, take, of, ttl, retention =
  ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local clock = server_clock()
local now_ms = clock / 1000
local function first_free()
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  if #first == 0 then return -2 end
  return math.max(tonumber(first[2]) - now_ms, 0)
end
if redis.call('EXISTS', tombstone) == 1 then return {0, first_free()} end
local live = prune(holders, permits, now_ms)
-- The fence of `owner`'s unexpired grant of exactly this claim, or nil.
local function held_by(owner)
  if not live or tonumber(redis.call('HGET', permits, 'of')) ~= of then return nil end
  local grant = redis.call('HGET', permits, owner)
  local t, f = string.match(grant or '', '^(%d+) (%d+)$')
  if tonumber(t) ~= take then return nil end
  return tonumber(f)
end
local expiry = ms(now_ms + ttl)
local fence, err
if held_by(from) then
"#,
    next_fence!(),
    r#"
  if not fence then return redis.error_reply(tostring(err)) end
  redis.call('ZREM', holders, from)
  forget(permits, from)
  redis.call('ZADD', holders, expiry, to)
  redis.call('HSET', permits, to, ARGV[3] .. ' ' .. ms(fence))
  redis.call('HINCRBY', permits, 'taken', take)
  keep_until_latest(holders, permits)
  return {1, fence}
end
fence = held_by(to)
if fence then
  redis.call('ZADD', holders, expiry, to)
  keep_until_latest(holders, permits)
  return {1, fence}
end
return {0, first_free()}
"#
));

/// Push the expiry of the owner's permits if they are still its and unexpired. KEYS:
/// holders, permits. ARGV: owner, ttl ms. Returns 1 or 0.
pub(crate) static EXTEND_PERMITS: Script = Script::new(concat!(
    permits_helpers!(),
    r#"
local holders, permits, owner = KEYS[1], KEYS[2], ARGV[1]
local now_ms = server_clock() / 1000
local held = redis.call('ZSCORE', holders, owner)
if not held or tonumber(held) <= now_ms then return 0 end
redis.call('ZADD', holders, 'XX', ms(now_ms + tonumber(ARGV[2])), owner)
keep_until_latest(holders, permits)
return 1
"#
));

/// Give back the owner's permits. KEYS: holders, permits. ARGV: owner, channel, notice.
/// Removes the owner's grant if it is there (expired or not) and announces the release on
/// the channel when the key was awaited. Returns 1 when the grant was there and unexpired,
/// 0 otherwise (nothing of another owner changes either way).
pub(crate) static RELEASE_PERMITS: Script = Script::new(concat!(
    permits_helpers!(),
    r#"
local holders, permits, owner = KEYS[1], KEYS[2], ARGV[1]
local now_ms = server_clock() / 1000
local held = redis.call('ZSCORE', holders, owner)
if not held then return 0 end
let_go(holders, permits, owner, ARGV[2], ARGV[3], now_ms)
if tonumber(held) > now_ms then return 1 end
return 0
"#
));

/// Every unexpired grant of a key, of both kinds. KEYS: lock, fence counter, holders,
/// permits. Returns a list of `{owner, pttl, fence, take, of}` (the lock's holder first,
/// without its awaited mark, with the counter as its fence and `1, 1` as its permits;
/// fence, take and of as decimal text, empty when unknown).
pub(crate) static HOLDERS: Script = Script::new(concat!(
    permits_helpers!(),
    r#"
local out = {}
local owner = redis.call('GET', KEYS[1])
if owner then
  if string.byte(owner, -1) == 42 then owner = string.sub(owner, 1, -2) end
  out[1] = {owner, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '', '1', '1'}
end
local now_ms = server_clock() / 1000
local live = redis.call('ZRANGEBYSCORE', KEYS[3], ms(now_ms), '+inf', 'WITHSCORES')
if #live > 0 then
  local of = redis.call('HGET', KEYS[4], 'of') or ''
  for i = 1, #live, 2 do
    local grant = redis.call('HGET', KEYS[4], live[i]) or ''
    local take, fence = string.match(grant, '^(%d+) (%d+)$')
    out[#out + 1] = {live[i], tonumber(live[i + 1]) - now_ms, fence or '', take or '', of}
  end
end
return out
"#
));
