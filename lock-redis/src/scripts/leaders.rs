//! The Lua scripts of leaders' values (elections): the value a leader published, kept
//! beside its lock.
//!
//! The leader of election `name` holds the lock `name` (the plain string of
//! [`ACQUIRE`](super::ACQUIRE): its holder's owner token, maybe with the awaited mark `*`).
//! Its published value lives in a hash beside the lock, under the lock's hash tag:
//!
//! - **leader** `<lock key>:leader`: `owner` (the publishing grant's owner token, 32 hex
//!   digits), `term` (its fence, in decimal, kept as text: never a Lua number) and `value`
//!   (the bytes published).
//!
//! The hash has no expiry: renewals of the lock never touch it, so an expiry of its own
//! could drop the value of a leader that still holds; it stays, like the key's fence
//! counter, until the next leader's publish overwrites it. A hash whose `owner` is not the
//! lock's current holder is an earlier leader's and is never answered ([`LEADER`]).

use super::Script;

/// Publish a leader's value if its grant still holds the lock, and announce it. KEYS: lock,
/// leader hash. ARGV: owner, term (decimal), value, channel, notice. Returns 1 when the
/// owner holds the lock (marked awaited or not): the hash becomes `owner`, `term`, `value`
/// and the notice is published on the release channel, so that the key's listeners in
/// every process wake; 0 when it does not (nothing changes, nothing is published). A
/// foreign value of another type at the lock key or at the hash is the script's error
/// (`WRONGTYPE`), with nothing written.
pub(crate) static PUBLISH_LEADER: Script = Script::new(concat!(
    awaited_helpers!(),
    r#"
if not mine(redis.call('GET', KEYS[1]), ARGV[1]) then return 0 end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'term', ARGV[2], 'value', ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"#
));

/// The current leader of an election. KEYS: lock, leader hash. Returns nil when the lock is
/// free, or when the hash is missing or was published by another owner than the lock's
/// current holder (an earlier leader's value); otherwise `{value, term, owner, pttl}` (the
/// owner without its awaited mark, the lock's `PTTL`: `-1` when it has no expiry). Reads
/// only.
pub(crate) static LEADER: Script = Script::new(
    r#"
local holder = redis.call('GET', KEYS[1])
if not holder then return false end
if string.byte(holder, -1) == 42 then holder = string.sub(holder, 1, -2) end
local kept = redis.call('HMGET', KEYS[2], 'owner', 'term', 'value')
if kept[1] ~= holder or not kept[2] or not kept[3] then return false end
return {kept[3], kept[2], holder, redis.call('PTTL', KEYS[1])}
"#,
);

/// Announce a change of an election's leadership (its leader resigned). KEYS: lock (only
/// to route the call to the lock's node on a cluster; not read). ARGV: channel, notice.
/// Publishes the notice on the release channel and returns 1.
pub(crate) static ANNOUNCE: Script = Script::new(
    r#"
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
"#,
);
