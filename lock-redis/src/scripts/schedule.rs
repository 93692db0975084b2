//! The Lua scripts of the scheduler's storage on one node: a job's run records (the
//! journal, [`APPEND_RUN`]) and its fire-time claims ([`CLAIM`], [`CURRENT_CLAIM`]). Both
//! live apart from every lock key, under the job's own hash tag.

use super::Script;

/// Store a run record of a job and trim the job's history, in one atomic step.
///
/// KEYS: the job's history list (newest at its head), its last-success key, its
/// last-failure key (one hash tag). ARGV: the encoded record; the text that marks the
/// record's slot in an encoded record (`"slot":"<slot>"`, which occurs in no other place of
/// a record: quotes inside JSON strings are escaped); the number of successes kept and the
/// number of other records kept (each at least 1, in decimal); `1` when the record is a
/// success, `1` when it is a failure (each then also replaces the last success or last
/// failure, which no trim touches).
///
/// The kept record of the same slot, if any, is replaced where it stands (`LSET`), else
/// the record is pushed as the newest (`LPUSH`). Then, newest first, every record past its
/// class's bound (a success is a record whose text holds `"outcome":"ok"`, every other one
/// counts as other, foreign values included) is overwritten with a marker that is never a
/// record (a record is a JSON object) and the markers are removed (`LREM`). The list is
/// written before the last success or failure, so a value of another type at the history
/// key (`WRONGTYPE`) fails the script before it writes anything. Returns 1.
pub(crate) static APPEND_RUN: Script = Script::new(
    r#"
local items = redis.call('LRANGE', KEYS[1], 0, -1)
local at = false
for i = 1, #items do
  if string.find(items[i], ARGV[2], 1, true) then
    at = i
    break
  end
end
if at then
  redis.call('LSET', KEYS[1], at - 1, ARGV[1])
  items[at] = ARGV[1]
else
  redis.call('LPUSH', KEYS[1], ARGV[1])
  table.insert(items, 1, ARGV[1])
end
local keep_ok, keep_other = tonumber(ARGV[3]), tonumber(ARGV[4])
local ok, other, trimmed = 0, 0, false
local marker = 'distlock:trimmed'
for i = 1, #items do
  local kept
  if string.find(items[i], '"outcome":"ok"', 1, true) then
    ok = ok + 1
    kept = ok <= keep_ok
  else
    other = other + 1
    kept = other <= keep_other
  end
  if not kept then
    redis.call('LSET', KEYS[1], i - 1, marker)
    trimmed = true
  end
end
if trimmed then redis.call('LREM', KEYS[1], 0, marker) end
if ARGV[5] == '1' then redis.call('SET', KEYS[2], ARGV[1]) end
if ARGV[6] == '1' then redis.call('SET', KEYS[3], ARGV[1]) end
return 1
"#,
);

/// Lua helpers of the fire-time claims ([`CLAIM`], [`CURRENT_CLAIM`]). `kept_claim(key)`
/// reads the claim hash at `key` into `fire, replica, at` (all `false` when there is no
/// key), or returns `false, message` when a value that is not a claim sits there: another
/// type (`WRONGTYPE`), or a hash without a claim's fields. Fire times and claim times are
/// kept as decimal text (milliseconds since the Unix epoch, no leading zeros) and compared
/// digit by digit by `older(a, b)` (`a` before `b`), never as Lua numbers (doubles, exact
/// only up to 2^53), so every `u64` fire time compares exactly. `server_millis()` is the
/// server's `TIME` in whole milliseconds, as text.
macro_rules! claim_helpers {
    () => {
        r#"
local function decimal(s)
  return type(s) == 'string' and (s == '0' or string.match(s, '^[1-9]%d*$') ~= nil)
end
local function older(a, b)
  if #a ~= #b then return #a < #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return false
end
local function kept_claim(key)
  local kept = redis.pcall('HMGET', key, 'fire', 'replica', 'at')
  if type(kept) == 'table' and kept.err then
    -- A value of another type is foreign; any other refusal (an ACL without HMGET, OOM)
    -- is the server's error, returned as the script's.
    if string.find(tostring(kept.err), 'WRONGTYPE', 1, true) then
      return false, tostring(kept.err)
    end
    return nil, kept
  end
  local fire, replica, at = kept[1], kept[2], kept[3]
  if not fire and not replica and not at and redis.call('EXISTS', key) == 0 then
    return true, false, false, false
  end
  if not (decimal(fire) and type(replica) == 'string' and decimal(at)) then
    return false, 'a hash without the fields of a claim (fire, replica, at)'
  end
  return true, fire, replica, at
end
local function server_millis()
  local now = redis.call('TIME')
  return now[1] .. string.format('%03d', math.floor(tonumber(now[2]) / 1000))
end
"#
    };
}

/// Claim a fire time of a job, in one atomic step. KEYS: the job's claim hash. ARGV: the
/// fire time (decimal milliseconds since the Unix epoch, no leading zeros), the replica,
/// the retention in milliseconds. When no claim is kept, or the kept fire time is older
/// than ARGV's, the hash becomes `fire`, `replica` and `at` (the server's `TIME` in ms),
/// its expiry is set to the retention, and the reply is
/// `{1, fire, replica, at, server ms}`; otherwise nothing changes and the reply is
/// `{0, kept fire, kept replica, kept at, server ms}`. A value that is not a claim at the
/// key is answered `{'foreign', message}` and left as it is; any other refusal of the
/// server (an ACL without `HMGET`) is the script's error. Only commands of Redis 5.0
/// (`TIME`, `HMGET`, `EXISTS`, `HSET` of several fields, `PEXPIRE`); `TIME` before a write
/// is allowed since scripts are replicated by their effects (the default from 5.0).
pub(crate) static CLAIM: Script = Script::new(concat!(
    claim_helpers!(),
    r#"
local ok, fire, replica, at = kept_claim(KEYS[1])
if ok == nil then return fire end
if not ok then return {'foreign', fire} end
local now = server_millis()
if fire and not older(fire, ARGV[1]) then return {0, fire, replica, at, now} end
redis.call('HSET', KEYS[1], 'fire', ARGV[1], 'replica', ARGV[2], 'at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, ARGV[1], ARGV[2], now, now}
"#
));

/// The claim kept for a job. KEYS: the job's claim hash. Returns `false` (nil) when there
/// is none, `{fire, replica, at}` (as [`CLAIM`] keeps them), or `{'foreign', message}`
/// when a value that is not a claim sits at the key.
pub(crate) static CURRENT_CLAIM: Script = Script::new(concat!(
    claim_helpers!(),
    r#"
local ok, fire, replica, at = kept_claim(KEYS[1])
if ok == nil then return fire end
if not ok then return {'foreign', fire} end
if not fire then return false end
return {fire, replica, at}
"#
));
