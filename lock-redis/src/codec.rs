//! How values look on the wire: key names, owner tokens, milliseconds, and the shapes of
//! simple replies.

use std::time::Duration;

use lock_core::Owner;
use redis::Value;

use crate::error::Failure;

/// The text of a string reply.
pub(crate) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// `n` integers of an array reply.
pub(crate) fn integers(reply: &Value, n: usize) -> std::result::Result<Vec<i64>, Failure> {
    let unexpected = || Failure::unexpected(reply);
    match reply {
        Value::Array(items) if items.len() == n => items
            .iter()
            .map(|v| match v {
                Value::Int(i) => Ok(*i),
                _ => Err(unexpected()),
            })
            .collect(),
        _ => Err(unexpected()),
    }
}

/// Milliseconds of a duration, rounded up.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// `<prefix>{<name>}<suffix>`.
pub(crate) fn key(prefix: &str, name: &str, suffix: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + name.len() + suffix.len() + 2);
    key.push_str(prefix);
    key.push('{');
    key.push_str(name);
    key.push('}');
    key.push_str(suffix);
    key
}

/// The owner token as stored: 32 lowercase hex digits (as `Owner`'s `Display`, without
/// the formatting machinery on the hot path).
pub(crate) fn hex(owner: Owner) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let value = owner.as_u128();
    let mut out = [0u8; 32];
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = DIGITS[((value >> ((31 - i) * 4)) & 0xf) as usize];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_up() {
        assert_eq!(millis(Duration::from_millis(10)), 10);
        assert_eq!(millis(Duration::from_micros(10_001)), 11);
        assert_eq!(
            millis(Duration::MAX),
            u64::try_from(Duration::MAX.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
        );
    }

    #[test]
    fn owner_hex_and_keys_have_the_stored_form() {
        for owner in [
            Owner::from_u128(0),
            Owner::from_u128(u128::MAX),
            Owner::random(),
        ] {
            assert_eq!(&hex(owner)[..], owner.to_string().as_bytes());
        }
        assert_eq!(key("p:", "a/b", ""), "p:{a/b}");
        assert_eq!(key("", "x", ":fence"), "{x}:fence");
    }
}
