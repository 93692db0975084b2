//! The scripts of claims of several permits on PostgreSQL, and the literals they splice.

/// A text literal of `value`, safe whatever `standard_conforming_strings` says: an `E'…'`
/// string with its backslashes and quotes doubled. For the values spliced into the permits'
/// scripts (an owner token, the channel), which are plain ASCII already; a key is spliced
/// as hex ([`key_literal`]), never as its bytes.
pub(crate) fn literal(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 3);
    out.push_str("E'");
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            // No text value holds a NUL; dropping it cannot end the literal early.
            '\0' => {}
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// `key` in lowercase hex: digits and `a`–`f` only, so safe inside a literal; also what
/// `encode(key, 'hex')` gives, which the advisory lock's number and the notices use.
pub(crate) fn hex(key: &[u8]) -> String {
    use std::fmt::Write;
    key.iter()
        .fold(String::with_capacity(key.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The `bytea` value of `key`, from its hex (see [`hex`]).
fn key_literal(hex: &str) -> String {
    format!("decode('{hex}', 'hex')")
}

/// The scripts of claims of several permits (semaphores, reader-writer keys), each a
/// simple-query string of several statements, which PostgreSQL runs as ONE implicit
/// transaction (a failing statement rolls back them all) without anything else of the
/// connection in between. The first statement takes the key's advisory lock, the same the
/// lock's granting statements take; in READ COMMITTED each later statement then reads
/// with a snapshot taken after the lock was granted, so it sees every earlier grant,
/// extension and release of the key's permits, all of which hold that lock too.
///
/// Values are spliced, never sent as raw bytes: the key as hex, the owner and the channel
/// as escaped literals ([`literal`]), numbers as numbers.
///
/// Layout: each holder is a row of `<table>_perms` (`key, owner, take, of, fence,
/// expires_at`). While any holds, the lease table keeps a **marker row** for the key:
/// owner `*<of>` (no owner token starts with `*`), the newest holder's fence, and the
/// latest holder's expiry, which every script keeps exactly (the latest live holder's,
/// deleted with the last). The lock's statements thus see a key held with permits as a
/// live row they neither take over nor release (told apart by its `*`), and a marker
/// expires exactly when the last holder does.
#[derive(Debug)]
pub(crate) struct PermitsSql {
    table: String,
    perms: String,
    /// `nextval` of the lease table's fence sequence.
    next: String,
    /// The advisory locks' class of this table.
    class: i32,
    /// The release channel, as a literal.
    channel: String,
}

/// The time the script's last statement reads once, after the advisory lock.
const NOW: &str = "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)";

impl PermitsSql {
    /// The scripts of the lease table `table` (quoted), its holders' table `perms`, the
    /// fence sequence's `nextval` text `next`, the advisory locks' `class` and the release
    /// `channel`.
    pub(crate) fn new(
        table: String,
        perms: String,
        next: String,
        class: i32,
        channel: &str,
    ) -> Self {
        PermitsSql {
            table,
            perms,
            next,
            class,
            channel: literal(channel),
        }
    }

    /// The key's advisory lock (as `pg_advisory_xact_lock(class, hashtext(encode(key,
    /// 'hex')))` of the lock's statements), held until the script commits.
    fn lock(&self, hex: &str) -> String {
        format!(
            "SELECT pg_advisory_xact_lock({class}, hashtext('{hex}'));",
            class = self.class
        )
    }

    /// Takes `take` of `of` permits of the key for `owner` for `ttl_ms`. Its last row:
    /// `verdict, fence, of, left`, where `verdict` is
    /// - `grant`: a new holder's row, with the next fence of the sequence;
    /// - `again`: `owner` holds already (a request re-sent after a lost reply): same fence,
    ///   fresh expiry;
    /// - `full`: the live holders leave fewer than `take` free; `left` is the time until
    ///   the first of them expires; the marker is marked awaited (its next release is
    ///   announced);
    /// - `lock`: a live lock holds the key;
    /// - `of`: the live holders claim `of` (another number of permits).
    ///
    /// Expired holders' rows are deleted first.
    pub(crate) fn acquire(
        &self,
        key: &[u8],
        owner: &str,
        take: u32,
        of: u32,
        ttl_ms: i64,
    ) -> String {
        let Self {
            table, perms, next, ..
        } = self;
        let hex = hex(key);
        let k = key_literal(&hex);
        let o = literal(owner);
        let marker = literal(&format!("*{of}"));
        let live = "expires_at > (SELECT t FROM now)";
        let ttl = format!("{ttl_ms}::bigint * interval '1 millisecond'");
        format!(
            "{lock} \
             DELETE FROM {perms} WHERE key = {k} AND expires_at <= clock_timestamp(); \
             {NOW}, \
             lease AS MATERIALIZED (SELECT owner FROM {table} WHERE key = {k} AND {live}), \
             held AS MATERIALIZED (SELECT count(*) AS n, coalesce(sum(take), 0) AS taken, \
             max(of) AS of, min(expires_at) AS soonest, \
             max(expires_at) FILTER (WHERE owner <> {o}) AS others, \
             max(fence) FILTER (WHERE owner = {o}) AS mine \
             FROM {perms} WHERE key = {k} AND {live}), \
             v AS MATERIALIZED (SELECT CASE \
             WHEN EXISTS (SELECT 1 FROM lease WHERE left(owner, 1) <> '*') THEN 'lock' \
             WHEN h.n > 0 AND h.of <> {of} THEN 'of' \
             WHEN h.mine IS NOT NULL THEN 'again' \
             WHEN h.taken + {take} > {of} THEN 'full' \
             ELSE 'grant' END AS verdict, h.* FROM held h), \
             g AS (INSERT INTO {perms} AS p (key, owner, take, of, fence, expires_at) \
             SELECT {k}, {o}, {take}, {of}, {next}, now.t + {ttl} FROM now, v \
             WHERE v.verdict = 'grant' \
             ON CONFLICT (key, owner) DO UPDATE SET take = EXCLUDED.take, of = EXCLUDED.of, \
             fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at \
             RETURNING fence, expires_at), \
             a AS (UPDATE {perms} SET expires_at = (SELECT t FROM now) + {ttl} \
             WHERE key = {k} AND owner = {o} AND (SELECT verdict FROM v) = 'again' \
             RETURNING fence, expires_at), \
             mine AS (SELECT fence, expires_at FROM g UNION ALL SELECT fence, expires_at FROM a), \
             m AS (INSERT INTO {table} AS l (key, owner, fence, expires_at, awaited) \
             SELECT {k}, {marker}, mine.fence, GREATEST(mine.expires_at, v.others), false \
             FROM mine, v \
             ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, \
             fence = GREATEST(EXCLUDED.fence, CASE WHEN l.owner = EXCLUDED.owner THEN l.fence END), \
             expires_at = EXCLUDED.expires_at, \
             awaited = l.owner = EXCLUDED.owner AND l.awaited \
             RETURNING 1), \
             w AS (UPDATE {table} SET awaited = true \
             WHERE key = {k} AND owner = {marker} AND (SELECT verdict FROM v) = 'full' \
             RETURNING 1) \
             SELECT v.verdict, (SELECT fence FROM mine), v.of, \
             GREATEST(0, CEIL(EXTRACT(EPOCH FROM (v.soonest - (SELECT t FROM now))) * 1000))::bigint, \
             (SELECT count(*) FROM m) + (SELECT count(*) FROM w) FROM v",
            lock = self.lock(&hex),
        )
    }

    /// Pushes `owner`'s expiry to `ttl_ms` from now if it holds unexpired, and the marker's
    /// to the latest holder's. Its last row: how many holder rows and markers changed
    /// (held: `1, 1`).
    pub(crate) fn extend(&self, key: &[u8], owner: &str, ttl_ms: i64) -> String {
        let Self { table, perms, .. } = self;
        let hex = hex(key);
        let k = key_literal(&hex);
        let o = literal(owner);
        format!(
            "{lock} \
             {NOW}, \
             u AS (UPDATE {perms} SET expires_at = (SELECT t FROM now) + \
             {ttl_ms}::bigint * interval '1 millisecond' \
             WHERE key = {k} AND owner = {o} AND expires_at > (SELECT t FROM now) \
             RETURNING expires_at), \
             rest AS MATERIALIZED (SELECT max(expires_at) AS last FROM {perms} \
             WHERE key = {k} AND owner <> {o} AND expires_at > (SELECT t FROM now)), \
             m AS (UPDATE {table} AS l SET expires_at = GREATEST((SELECT last FROM rest), u.expires_at) \
             FROM u WHERE l.key = {k} AND left(l.owner, 1) = '*' RETURNING 1) \
             SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM m)",
            lock = self.lock(&hex),
        )
    }

    /// Deletes `owner`'s holder row (expired or not), and sets the marker's expiry to the
    /// latest remaining live holder's, or deletes it when none remains; announces the
    /// release when the marker was awaited. Its last row, only when the row was there:
    /// `live, notified`.
    pub(crate) fn release(&self, key: &[u8], owner: &str) -> String {
        let Self {
            table,
            perms,
            channel,
            ..
        } = self;
        let hex = hex(key);
        let k = key_literal(&hex);
        let o = literal(owner);
        let marker = format!("key = {k} AND left(owner, 1) = '*'");
        format!(
            "{lock} \
             {NOW}, \
             d AS (DELETE FROM {perms} WHERE key = {k} AND owner = {o} \
             RETURNING expires_at > (SELECT t FROM now) AS live), \
             rest AS MATERIALIZED (SELECT max(expires_at) AS last FROM {perms} \
             WHERE key = {k} AND owner <> {o} AND expires_at > (SELECT t FROM now)), \
             m AS MATERIALIZED (SELECT awaited FROM {table} WHERE {marker}), \
             u AS (UPDATE {table} SET expires_at = (SELECT last FROM rest), awaited = false \
             WHERE {marker} AND EXISTS (SELECT 1 FROM d) \
             AND (SELECT last FROM rest) IS NOT NULL RETURNING 1), \
             x AS (DELETE FROM {table} WHERE {marker} AND EXISTS (SELECT 1 FROM d) \
             AND (SELECT last FROM rest) IS NULL RETURNING 1), \
             n AS (SELECT pg_notify({channel}, '{hex}') \
             WHERE EXISTS (SELECT 1 FROM d) AND EXISTS (SELECT 1 FROM m WHERE awaited)) \
             SELECT live, (SELECT count(*) FROM n), \
             (SELECT count(*) FROM u) + (SELECT count(*) FROM x) FROM d",
            lock = self.lock(&hex),
        )
    }

    /// Deletes every grant of the key, the lock's row (or the marker) and every holder of
    /// permits, in one transaction, and announces it when something was there. Its last
    /// row: `live` (a live grant was deleted), `notified`.
    pub(crate) fn force_release(&self, key: &[u8]) -> String {
        let Self {
            table,
            perms,
            channel,
            ..
        } = self;
        let hex = hex(key);
        let k = key_literal(&hex);
        format!(
            "{lock} \
             {NOW}, \
             p AS (DELETE FROM {perms} WHERE key = {k} \
             RETURNING expires_at > (SELECT t FROM now) AS live), \
             l AS (DELETE FROM {table} WHERE key = {k} \
             RETURNING expires_at > (SELECT t FROM now) AS live), \
             n AS (SELECT pg_notify({channel}, '{hex}') \
             WHERE EXISTS (SELECT 1 FROM p) OR EXISTS (SELECT 1 FROM l)) \
             SELECT EXISTS (SELECT 1 FROM p WHERE live) OR EXISTS (SELECT 1 FROM l WHERE live), \
             (SELECT count(*) FROM n)",
            lock = self.lock(&hex),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spliced_values_cannot_leave_their_literal() {
        assert_eq!(literal("0123abcd"), "E'0123abcd'");
        assert_eq!(literal(r"a'b\c"), r"E'a''b\\c'");
        assert_eq!(literal("x\0'"), "E'x'''");
        assert_eq!(hex(b"\0'k\xff"), "00276bff");
        assert_eq!(key_literal(&hex(b"k")), "decode('6b', 'hex')");
        assert_eq!(hex(b""), "");
    }
}
