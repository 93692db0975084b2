//! The names of the leaders' keys after their root (`leaders.rs` writes them, the leaders'
//! watch in `watch.rs` reads them back): apart from both so neither imports the other.

/// Marks a value key after the root.
pub(crate) const VALUE: &str = "v/";
/// Marks a notice key after the root.
pub(crate) const NOTICE: &str = "n/";

/// The election a leaders key (without its root) belongs to.
pub(crate) fn election_of(rest: &[u8]) -> Option<&str> {
    let name = rest
        .strip_prefix(VALUE.as_bytes())
        .or_else(|| rest.strip_prefix(NOTICE.as_bytes()))?;
    std::str::from_utf8(name).ok()
}
