//! Node names: a key of any bytes becomes one safe node name, and a lock node's name
//! carries its owner token (Curator's "protected" mode) and the server's sequence number.

use lock_core::Owner;

/// What follows the owner token in a lock node's name, before the sequence number.
const LOCK_MARK: &str = "-lock-";
/// Digits of a sequential node's suffix.
const SEQUENCE_DIGITS: usize = 10;

/// The node of `key` under `root`: `k-` and the key with every byte outside
/// `[A-Za-z0-9_.-]` written `%XX` (so `/`, `.`, `..`, `zookeeper` and control characters
/// never reach a path, and two keys never share a node).
pub(crate) fn key_node(root: &str, key: &str) -> String {
    let mut path = String::with_capacity(root.len() + 3 + key.len());
    path.push_str(root);
    path.push_str("/k-");
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
            path.push(char::from(b));
        } else {
            path.push_str(&format!("%{b:02X}"));
        }
    }
    path
}

/// The prefix of `owner`'s lock node under a key node, to which the server appends the
/// sequence number.
pub(crate) fn lock_prefix(key_node: &str, owner: Owner) -> String {
    format!("{key_node}/{owner}{LOCK_MARK}")
}

/// A lock node's owner token and sequence number, from its name; `None` for a node the
/// backend did not make.
pub(crate) fn parse_lock(name: &str) -> Option<(Owner, u64)> {
    let (owner, sequence) = name.split_once(LOCK_MARK)?;
    if sequence.len() != SEQUENCE_DIGITS || !sequence.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((Owner::parse(owner)?, sequence.parse().ok()?))
}

/// The lock nodes among `children`, in the order the server created them (by sequence):
/// `(sequence, owner, name)`.
pub(crate) fn in_line(children: Vec<String>) -> Vec<(u64, Owner, String)> {
    let mut line: Vec<(u64, Owner, String)> = children
        .into_iter()
        .filter_map(|name| parse_lock(&name).map(|(owner, seq)| (seq, owner, name)))
        .collect();
    line.sort_unstable_by_key(|(seq, _, _)| *seq);
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_safe_distinct_names() {
        assert_eq!(
            key_node("/distlock", "jobs/a b"),
            "/distlock/k-jobs%2Fa%20b"
        );
        assert_eq!(key_node("/d", ".."), "/d/k-..");
        assert_ne!(key_node("/d", "a%2F"), key_node("/d", "a/"));
        assert_eq!(key_node("/d", "é"), "/d/k-%C3%A9");
    }

    #[test]
    fn lock_names_round_trip() {
        let owner = Owner::random();
        let prefix = lock_prefix("/d/k-x", owner);
        let name = format!("{}0000000042", prefix.rsplit('/').next().unwrap());
        assert_eq!(parse_lock(&name), Some((owner, 42)));
        assert_eq!(parse_lock("other"), None);
        assert_eq!(parse_lock(&format!("{owner}-lock-12")), None);
        let line = in_line(vec![
            format!("{owner}-lock-0000000010"),
            "junk".into(),
            format!("{owner}-lock-0000000002"),
        ]);
        assert_eq!(line.iter().map(|l| l.0).collect::<Vec<_>>(), vec![2, 10]);
    }
}
