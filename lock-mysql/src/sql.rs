//! The scripts, one per operation, built from the validated [`Names`] and from values that
//! cannot change a statement's meaning: a key as a hex literal (`X'…'`, so a key may hold
//! any bytes, NUL included), an owner token as its 32 hex digits, a TTL as an integer.
//!
//! A script is several statements in one `COM_QUERY` (one round trip), run by the server
//! in order with nothing else of the connection in between; a script that writes more than
//! one row wraps itself in `START TRANSACTION … COMMIT`. Every script answers at most one
//! result set (the others are `SET`, `SELECT … INTO` and writes).
//!
//! Time is the database's: [`NOW_US`], microseconds since the Unix epoch on the server's
//! clock when read (`SYSDATE(6)`, not the statement's start, with the session's time zone
//! set to UTC on connect so that the conversion is exact all year round).
//!
//! Fences are drawn in grant order per key: a granting script first takes the row lock of
//! each of its keys (an `INSERT … ON DUPLICATE KEY UPDATE` of a placeholder row, which
//! locks the row whether it was there or not; a group's keys in ascending order), then
//! reads the time, then draws each fence from `<table>_fence`'s `AUTO_INCREMENT`, and
//! keeps the row locks until it commits. Without the lock first, a script held up between
//! drawing its fence and writing its row could find the key free again after a later
//! grant with a higher fence came and went, and be granted with its lower one.

use std::fmt::Write as _;

use crate::config::Names;

/// Microseconds since the Unix epoch on the server's clock, when evaluated.
pub(crate) const NOW_US: &str = "CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)";

/// One acquisition of a group: the key, the owner token, the TTL in microseconds.
pub(crate) struct AcquireRow<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) owner: &'a str,
    pub(crate) ttl_us: i64,
}

/// One hand-over of a group: the key, from which owner, to which, for how long (µs).
pub(crate) struct HandOverRow<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) owner: &'a str,
    pub(crate) next: &'a str,
    pub(crate) ttl_us: i64,
}

/// The statements of one lease table.
#[derive(Debug)]
pub(crate) struct Sql {
    names: Names,
}

/// `X'…'`: `key` as a hex literal.
pub(crate) fn hex(key: &[u8]) -> String {
    let mut out = String::with_capacity(key.len() * 2 + 3);
    out.push_str("X'");
    for b in key {
        let _ = write!(out, "{b:02x}");
    }
    out.push('\'');
    out
}

/// `'…'`: an owner token (only hex digits) as a string literal.
fn text(owner: &str) -> String {
    debug_assert!(owner.bytes().all(|b| b.is_ascii_hexdigit()));
    format!("'{owner}'")
}

/// `(X'k1', X'k2', …)`: the keys, for `lock_key IN …`.
fn key_list<'a>(keys: impl Iterator<Item = &'a [u8]>) -> String {
    let keys: Vec<String> = keys.map(hex).collect();
    format!("({})", keys.join(", "))
}

/// `lock_key IN (…) AND ((lock_key = … AND owner = …) OR …)`: the keys' rows holding
/// their owners (the `IN` keeps it a range scan of the primary key).
fn owned<'a>(pairs: impl Iterator<Item = (&'a [u8], &'a str)> + Clone) -> String {
    let one: Vec<String> = pairs
        .clone()
        .map(|(key, owner)| format!("(lock_key = {} AND owner = {})", hex(key), text(owner)))
        .collect();
    format!(
        "lock_key IN {} AND ({})",
        key_list(pairs.map(|(key, _)| key)),
        one.join(" OR ")
    )
}

impl Sql {
    pub(crate) fn new(names: &Names) -> Sql {
        Sql {
            names: names.clone(),
        }
    }

    /// The quoted `` `database`.`table` `` of the lease table.
    pub(crate) fn table(&self) -> &str {
        &self.names.table
    }

    /// Draws a fence into `@d_f` when `@d_{flag}` is true (0 otherwise): an insert into
    /// `<table>_fence` and the deletion of its row in the same transaction (the counter
    /// keeps its value: it is persistent in InnoDB on MariaDB 10.2.4+ and MySQL 8).
    fn draw_fence(&self, out: &mut String, flag: &str) {
        let fence = &self.names.fence;
        let _ = write!(
            out,
            "INSERT INTO {fence} (id) SELECT NULL FROM DUAL WHERE @d_{flag}; \
             SET @d_f = IF(@d_{flag}, LAST_INSERT_ID(), 0); \
             DELETE FROM {fence} WHERE id = @d_f; "
        );
    }

    /// Acquisitions of distinct keys, in one transaction. Each row is locked first (a
    /// placeholder `('', 0, 0)`, expired, for a new key), in ascending key order; then the
    /// time is read; then each key is taken over when its row has expired (a new fence), its
    /// expiry renewed when it holds the same owner (a request re-sent after a lost answer:
    /// same fence), or left as it is. Answers `lock_key, owner, fence, µs left` per key.
    pub(crate) fn acquire(&self, rows: &mut [AcquireRow<'_>]) -> String {
        rows.sort_by(|a, b| a.key.cmp(b.key));
        let table = &self.names.table;
        let mut out = String::from("START TRANSACTION; ");
        let values: Vec<String> = rows
            .iter()
            .map(|r| format!("({}, '', 0, 0)", hex(r.key)))
            .collect();
        let _ = write!(
            out,
            "INSERT INTO {table} (lock_key, owner, fence, expires_us) VALUES {} \
             ON DUPLICATE KEY UPDATE fence = fence; SET @d_now = {NOW_US}; ",
            values.join(", ")
        );
        for r in rows.iter() {
            let (key, owner) = (hex(r.key), text(r.owner));
            let _ = write!(
                out,
                "SELECT expires_us <= @d_now, owner = {owner} INTO @d_free, @d_mine \
                 FROM {table} WHERE lock_key = {key}; "
            );
            self.draw_fence(&mut out, "free");
            // The conditions are read from variables: MySQL evaluates an UPDATE's
            // assignments left to right, each seeing the columns already assigned.
            let _ = write!(
                out,
                "UPDATE {table} SET owner = IF(@d_free, {owner}, owner), \
                 fence = IF(@d_free, @d_f, fence), \
                 expires_us = IF(@d_free OR @d_mine, @d_now + {ttl}, expires_us) \
                 WHERE lock_key = {key}; ",
                ttl = r.ttl_us
            );
        }
        let _ = write!(
            out,
            "SELECT lock_key, owner, fence, GREATEST(0, expires_us - @d_now) FROM {table} \
             WHERE lock_key IN {}; COMMIT",
            key_list(rows.iter().map(|r| r.key))
        );
        out
    }

    /// Releases of distinct keys, in one transaction: each row holding its owner is deleted
    /// (expired or not). Answers `lock_key, live` for each row deleted.
    pub(crate) fn release<'a>(
        &self,
        pairs: impl Iterator<Item = (&'a [u8], &'a str)> + Clone,
    ) -> String {
        let table = &self.names.table;
        let which = owned(pairs);
        format!(
            "START TRANSACTION; \
             SELECT lock_key, expires_us > {NOW_US} FROM {table} WHERE {which} FOR UPDATE; \
             DELETE FROM {table} WHERE {which}; COMMIT"
        )
    }

    /// Hand-overs of distinct keys, in one transaction: the rows are locked in ascending
    /// key order, the time read, then each row still holding its owner unexpired passes to
    /// the next owner with a new fence. Answers `lock_key, fence` of each key handed over.
    pub(crate) fn hand_over(&self, rows: &mut [HandOverRow<'_>]) -> String {
        rows.sort_by(|a, b| a.key.cmp(b.key));
        let table = &self.names.table;
        let keys = key_list(rows.iter().map(|r| r.key));
        let mut out = format!(
            "START TRANSACTION; UPDATE {table} SET fence = fence WHERE lock_key IN {keys}; \
             SET @d_now = {NOW_US}; "
        );
        for r in rows.iter() {
            let (key, owner, next) = (hex(r.key), text(r.owner), text(r.next));
            let _ = write!(
                out,
                "SET @d_live = 0; SELECT 1 INTO @d_live FROM {table} \
                 WHERE lock_key = {key} AND owner = {owner} AND expires_us > @d_now; "
            );
            self.draw_fence(&mut out, "live");
            let _ = write!(
                out,
                "UPDATE {table} SET owner = {next}, fence = @d_f, \
                 expires_us = @d_now + {ttl} WHERE lock_key = {key} AND @d_live; ",
                ttl = r.ttl_us
            );
        }
        let _ = write!(
            out,
            "SELECT lock_key, fence FROM {table} WHERE {}; COMMIT",
            owned(rows.iter().map(|r| (r.key, r.next)))
        );
        out
    }

    /// Pushes the expiry of `key`'s row to `ttl_us` from now if it holds `owner`
    /// unexpired. Answers one row: how many rows changed (0 or 1).
    pub(crate) fn extend(&self, key: &[u8], owner: &str, ttl_us: i64) -> String {
        format!(
            "SET @d_now = {NOW_US}; UPDATE {table} SET expires_us = @d_now + {ttl_us} \
             WHERE lock_key = {key} AND owner = {owner} AND expires_us > @d_now; \
             SELECT ROW_COUNT()",
            table = self.names.table,
            key = hex(key),
            owner = text(owner),
        )
    }

    /// The unexpired holder of `key`: `owner, fence, µs left`.
    pub(crate) fn inspect(&self, key: &[u8]) -> String {
        format!(
            "SET @d_now = {NOW_US}; SELECT owner, fence, expires_us - @d_now FROM {table} \
             WHERE lock_key = {key} AND expires_us > @d_now",
            table = self.names.table,
            key = hex(key),
        )
    }

    /// Deletes `key`'s row whoever holds it. Answers one row: whether it was live.
    pub(crate) fn force_release(&self, key: &[u8]) -> String {
        let (table, key) = (&self.names.table, hex(key));
        format!(
            "START TRANSACTION; SELECT COUNT(*) FROM {table} WHERE lock_key = {key} \
             AND expires_us > {NOW_US} FOR UPDATE; DELETE FROM {table} WHERE lock_key = {key}; \
             COMMIT"
        )
    }

    /// The raw baseline's write: an insert unless the key's row is there.
    pub(crate) fn raw_set(&self, key: &[u8], value: &str, ttl_us: i64) -> String {
        format!(
            "INSERT IGNORE INTO {raw} (lock_key, value, expires_us) \
             VALUES ({key}, '{value}', {NOW_US} + {ttl_us})",
            raw = self.names.raw,
            key = hex(key),
        )
    }

    /// The raw baseline's deletion.
    pub(crate) fn raw_del(&self, key: &[u8]) -> String {
        format!(
            "DELETE FROM {raw} WHERE lock_key = {key}",
            raw = self.names.raw,
            key = hex(key)
        )
    }

    /// The tables, created when missing: the lease table, the fences' counter, the raw
    /// baseline's table. Keys are `VARBINARY(1024)` (the longest key distlock accepts).
    pub(crate) fn create(&self) -> String {
        let Names { table, fence, raw } = &self.names;
        format!(
            "CREATE TABLE IF NOT EXISTS {table} (\
             lock_key VARBINARY(1024) NOT NULL, \
             owner VARCHAR(40) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
             fence BIGINT UNSIGNED NOT NULL, expires_us BIGINT NOT NULL, \
             PRIMARY KEY (lock_key)) ENGINE=InnoDB; \
             CREATE TABLE IF NOT EXISTS {fence} (\
             id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, PRIMARY KEY (id)) ENGINE=InnoDB; \
             CREATE TABLE IF NOT EXISTS {raw} (\
             lock_key VARBINARY(1024) NOT NULL, \
             value VARCHAR(64) CHARACTER SET ascii NOT NULL, expires_us BIGINT NOT NULL, \
             PRIMARY KEY (lock_key)) ENGINE=InnoDB"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_hex_literals() {
        assert_eq!(hex(b"a\0'"), "X'610027'");
        assert_eq!(hex(b""), "X''");
    }
}
