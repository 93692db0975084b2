//! The statements, one per operation, built from the validated [`Names`] (the only text
//! spliced into them; keys, owners and TTLs are always parameters).
//!
//! Parameters: `$1` the key (`bytea`, so a key may hold any bytes, NUL included), `$2` the
//! owner token (32 hex digits), `$3` the TTL in milliseconds or the release channel.
//! Time is the database's: `clock_timestamp()`, read once per statement where a decision
//! and an expiry must agree.
//!
//! Fences are drawn in grant order per key: a statement that may grant (acquire,
//! hand-over) first takes the key's transaction-scoped advisory lock, then reads the time
//! and draws `nextval`, and keeps the lock until it commits. Without it, a statement held
//! up between drawing its fence and writing its row (a descheduled backend) could find the
//! key free again after a later grant with a higher fence came and went, and be granted
//! with its lower one (test `a_fence_drawn_before_a_later_grant_is_never_granted_after_it`).
//! The lock is in the two-key advisory space, under a class number derived from the table
//! (so it never meets a user's one-key `pg_advisory_lock`), keyed by `hashtext` of the key;
//! two keys with one hash only wait for each other.

use crate::config::Names;
use crate::permits_sql::PermitsSql;

/// The text of every statement of one lease table.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) acquire: String,
    /// `acquire` for many keys at once: `$1` keys, `$2` owners, `$3` TTLs, as arrays.
    pub(crate) acquire_many: String,
    pub(crate) extend: String,
    pub(crate) release: String,
    /// `release` for many keys at once: `$1` keys, `$2` owners, as arrays; `$3` the channel.
    pub(crate) release_many: String,
    pub(crate) hand_over: String,
    /// `hand_over` for many keys at once: `$1` keys, `$2` owners, `$3` TTLs, `$4` the next
    /// owners, as arrays.
    pub(crate) hand_over_many: String,
    pub(crate) inspect: String,
    pub(crate) raw_set: String,
    pub(crate) raw_del: String,
    /// A run record: `$1` the job (`bytea`), `$2` the encoded record, `$3` and `$4` how
    /// many successes and others to keep (each at least 1), `$5` the record's slot, `$6`
    /// whether it is a success, `$7` whether it is a failure.
    pub(crate) append_run: String,
    /// The newest `$2` records of `$1`.
    pub(crate) recent_runs: String,
    /// The reserved row `$2` of job `$1` ([`LAST_SUCCESS`], [`LAST_FAILURE`], [`CONTROL`]).
    pub(crate) run_row: String,
    /// Replaces job `$1`'s control with `$2`.
    pub(crate) set_control: String,
    /// A fire-time claim: `$1` the job (`bytea`), `$2` the fire time in milliseconds since
    /// the Unix epoch, `$3` the replica (`bytea`).
    pub(crate) claim: String,
    /// The claim kept for `$1`, and the database's clock.
    pub(crate) current_claim: String,
    /// A leader's value: `$1` the key, `$2` the owner, `$3` the fence (the term), `$4` the
    /// value (`bytea`), `$5` the channel.
    pub(crate) publish: String,
    /// The leader of `$1`: its value, term, owner and time left.
    pub(crate) leader: String,
    /// The notice of `$1` on the channel `$2`.
    pub(crate) announce: String,
    pub(crate) exists: String,
    /// Run in one transaction when something is missing (the schema first, when missing):
    /// the lease table, its sequence, the raw baseline's table, the run records' table (and
    /// the upgrade of one an older version made: its slot columns and index), the permits'
    /// holders' table, the fire-time claims' table and the leaders' values' table; then
    /// the permits' functions (`permits.create`, also made for a database an older version
    /// made).
    pub(crate) create: Vec<String>,
    /// The functions of claims of several permits, and their calls.
    pub(crate) permits: PermitsSql,
    pub(crate) create_schema: String,
}

/// The run records' row `id` of a job's last success (the sequence starts at 1: no record
/// has an id below 1).
pub(crate) const LAST_SUCCESS: i64 = 0;
/// The run records' row `id` of a job's last failure.
pub(crate) const LAST_FAILURE: i64 = -1;
/// The run records' row `id` of a job's control.
pub(crate) const CONTROL: i64 = -2;

/// Whether a run record's row is a success: its `ok` column, or for a row stored before
/// the column existed (by an older version), its bytes, which hold `"outcome":"ok"` only
/// as that field (a quote inside a JSON string is escaped).
const IS_OK: &str = "COALESCE(ok, position('\"outcome\":\"ok\"'::bytea IN record) > 0)";

/// `… * interval '1 millisecond'` of the TTL parameter `$n`.
fn ms(n: u8) -> String {
    format!("${n}::bigint * interval '1 millisecond'")
}

/// Milliseconds left from `now` until `expires_at`, rounded up, never negative.
const LEFT: &str =
    "GREATEST(0, CEIL(EXTRACT(EPOCH FROM (expires_at - (SELECT t FROM now))) * 1000))::bigint";

impl Sql {
    pub(crate) fn new(names: &Names) -> Sql {
        let Names {
            schema,
            table,
            sequence,
            runs,
            raw_table: bare_table,
            fires,
            perms,
            leads,
            ..
        } = names;
        // A quoted, validated name inside a string literal: it holds no `'`.
        let next = format!("nextval('{sequence}')");
        let now = "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)";
        // The key's advisory lock, then the time (taken after any wait for the lock); the
        // statement's `nextval` comes after both, as it reads `now`.
        let class = crate::config::fnv1a(table.as_bytes()) as u32 as i32;
        let locked_now = format!(
            "WITH lk AS MATERIALIZED (SELECT pg_advisory_xact_lock({class}, \
             hashtext(encode($1::bytea, 'hex')))), \
             now AS MATERIALIZED (SELECT clock_timestamp() AS t FROM lk)"
        );
        let expired = "l.expires_at <= (SELECT t FROM now)";
        // A group's advisory locks, in ascending order of their numbers (each taken once),
        // all before the statement's time is read and before any row is touched.
        let group_locks = format!(
            "lk AS MATERIALIZED (SELECT pg_advisory_xact_lock({class}, h) FROM \
             (SELECT DISTINCT hashtext(encode(key, 'hex')) AS h FROM req ORDER BY 1) s)"
        );
        // What a taken-over, refused or re-asked row becomes: shared by the single and the
        // grouped acquisition, so both decide alike.
        let on_conflict = format!(
            "ON CONFLICT (key) DO UPDATE SET \
             owner = CASE WHEN {expired} THEN EXCLUDED.owner ELSE l.owner END, \
             fence = CASE WHEN {expired} THEN EXCLUDED.fence ELSE l.fence END, \
             expires_at = CASE WHEN {expired} OR l.owner = EXCLUDED.owner \
             THEN EXCLUDED.expires_at ELSE l.expires_at END, \
             awaited = CASE WHEN {expired} THEN false \
             WHEN l.owner = EXCLUDED.owner THEN l.awaited ELSE true END"
        );
        Sql {
            // Insert, or take over an expired row; a live holder's row is kept as it was
            // but marked awaited (its release then announces itself), and its time left
            // returned. The holder itself asking again (a request re-sent after a lost
            // reply) keeps its fence and gets a fresh expiry, counted from this statement,
            // as its guard's validity is counted from before it. One statement, whatever the row's state, so the answer always comes
            // from the row as the statement saw it (not from an older snapshot).
            acquire: format!(
                "{locked_now} INSERT INTO {table} AS l (key, owner, fence, expires_at, awaited) \
                 SELECT $1::bytea, $2::text, {next}, now.t + {ttl}, false FROM now \
                 {on_conflict} \
                 RETURNING owner = $2::text, fence, {LEFT}, owner",
                ttl = ms(3),
            ),
            // The same for each row of the arrays, in key order; every row comes back (an
            // insert or an update), with its key and owner so the caller tells its own.
            acquire_many: format!(
                "WITH req AS (SELECT * FROM unnest($1::bytea[], $2::text[], $3::bigint[]) \
                 AS r(key, owner, ttl)), {group_locks}, \
                 now AS MATERIALIZED (SELECT clock_timestamp() AS t FROM \
                 (SELECT count(*) FROM lk) c) \
                 INSERT INTO {table} AS l (key, owner, fence, expires_at, awaited) \
                 SELECT r.key, r.owner, {next}, now.t + r.ttl * interval '1 millisecond', \
                 false FROM req r, now ORDER BY r.key \
                 {on_conflict} \
                 RETURNING key, owner, fence, {LEFT}"
            ),
            extend: format!(
                "UPDATE {table} SET expires_at = clock_timestamp() + {ttl} \
                 WHERE key = $1::bytea AND owner = $2::text AND expires_at > clock_timestamp() \
                 RETURNING fence",
                ttl = ms(3),
            ),
            // Deletes the owner's row even when expired (nobody else holds it then), but only
            // a live one counts as released. Announces only what someone waits for.
            release: format!(
                "WITH d AS (DELETE FROM {table} WHERE key = $1::bytea AND owner = $2::text \
                 RETURNING key, awaited, expires_at > clock_timestamp() AS live), \
                 n AS (SELECT pg_notify($3::text, encode(key, 'hex')) FROM d WHERE awaited) \
                 SELECT live, (SELECT count(*) FROM n) FROM d"
            ),
            // The same for each row of the arrays, after the group's advisory locks (so a
            // grouped release never holds a row that a grouped acquisition, holding the
            // key's advisory lock, waits for while it waits for one of that one's rows).
            release_many: format!(
                "WITH req AS (SELECT * FROM unnest($1::bytea[], $2::text[]) AS r(key, owner)), \
                 {group_locks}, \
                 d AS (DELETE FROM {table} l USING req r \
                 WHERE l.key = r.key AND l.owner = r.owner AND (SELECT count(*) FROM lk) >= 0 \
                 RETURNING l.key, l.awaited, l.expires_at > clock_timestamp() AS live), \
                 n AS (SELECT pg_notify($3::text, encode(key, 'hex')) FROM d WHERE awaited) \
                 SELECT key, live, (SELECT count(*) FROM n) FROM d"
            ),
            hand_over: format!(
                "{locked_now} UPDATE {table} AS l SET owner = $4::text, fence = {next}, \
                 expires_at = (SELECT t FROM now) + {ttl} \
                 WHERE key = $1::bytea AND owner = $2::text AND NOT ({expired}) \
                 RETURNING fence",
                ttl = ms(3),
            ),
            hand_over_many: format!(
                "WITH req AS (SELECT * FROM unnest($1::bytea[], $2::text[], $3::bigint[], \
                 $4::text[]) AS r(key, owner, ttl, next)), {group_locks}, \
                 now AS MATERIALIZED (SELECT clock_timestamp() AS t FROM \
                 (SELECT count(*) FROM lk) c) \
                 UPDATE {table} AS l SET owner = r.next, fence = {next}, \
                 expires_at = (SELECT t FROM now) + r.ttl * interval '1 millisecond' \
                 FROM req r WHERE l.key = r.key AND l.owner = r.owner AND NOT ({expired}) \
                 RETURNING l.key, l.fence"
            ),
            // The lock's holder (a marker row of permits is no holder), then every holder of
            // the key's permits; each with its take and of.
            inspect: format!(
                "{now} SELECT owner, fence, {LEFT}, 1::integer, 1::integer FROM {table} \
                 WHERE key = $1::bytea AND expires_at > (SELECT t FROM now) \
                 AND left(owner, 1) <> '*' \
                 UNION ALL \
                 SELECT owner, fence, {LEFT}, take, of FROM {perms} \
                 WHERE key = $1::bytea AND expires_at > (SELECT t FROM now)"
            ),
            raw_set: format!(
                "INSERT INTO {raw} (key, value, expires_at) \
                 VALUES ($1::bytea, $2::text, clock_timestamp() + {ttl}) \
                 ON CONFLICT (key) DO NOTHING",
                raw = raw_table(names),
                ttl = ms(3),
            ),
            raw_del: format!("DELETE FROM {} WHERE key = $1::bytea", raw_table(names)),
            // Run records (see `append_run`'s fields for the parameters). One statement:
            // `cur` is the job's records as the statement's snapshot has them (which does
            // not see its own writes), `after` the job's classes once the record is stored
            // (its slot's kept row takes its class; a new row, id NULL, is the newest), and
            // `gone` the rows past their class's bound. `up` stores the record (a new row,
            // or the slot's kept row replaced, which keeps its id and so its place) unless
            // that kept row is itself gone (a row is never both updated and deleted by one
            // statement); `last` replaces the last success or failure; `old` deletes the
            // rows gone, each only as the snapshot had it (its `xmin`: a row replaced since
            // by a concurrent append, a run's end replacing its running record, is left for
            // the next append's trim, not deleted for the class it had). Two appends of one
            // job at once each count the rows stored before them, so together they may
            // leave one row too many, until the next append.
            append_run: format!(
                "WITH cur AS MATERIALIZED (SELECT id, xmin AS seen, slot = $5::text AS mine, \
                 {IS_OK} AS ok \
                 FROM {runs} WHERE job = $1::bytea AND id > 0), \
                 after AS (SELECT id, CASE WHEN mine THEN $6::boolean ELSE ok END AS ok \
                 FROM cur UNION ALL SELECT NULL::bigint, $6::boolean \
                 WHERE NOT EXISTS (SELECT 1 FROM cur WHERE mine)), \
                 gone AS MATERIALIZED (SELECT id FROM (SELECT id, ok, row_number() OVER \
                 (PARTITION BY ok ORDER BY id DESC NULLS FIRST) AS n FROM after) ranked \
                 WHERE n > CASE WHEN ok THEN $3::bigint ELSE $4::bigint END), \
                 up AS (INSERT INTO {runs} (job, slot, ok, record) \
                 SELECT $1::bytea, $5::text, $6::boolean, $2::bytea \
                 WHERE NOT EXISTS (SELECT 1 FROM cur JOIN gone USING (id) WHERE cur.mine) \
                 ON CONFLICT (job, slot) DO UPDATE SET ok = EXCLUDED.ok, \
                 record = EXCLUDED.record RETURNING id), \
                 last AS (INSERT INTO {runs} (job, id, record) \
                 SELECT $1::bytea, v.id, $2::bytea FROM (VALUES \
                 ({LAST_SUCCESS}::bigint, $6::boolean), ({LAST_FAILURE}, $7::boolean)) \
                 AS v(id, yes) WHERE v.yes \
                 ON CONFLICT (job, id) DO UPDATE SET record = EXCLUDED.record), \
                 old AS (DELETE FROM {runs} r USING gone g, cur c \
                 WHERE r.job = $1::bytea AND r.id = g.id AND c.id = g.id AND r.xmin = c.seen \
                 RETURNING r.id) \
                 SELECT (SELECT count(*) FROM up), (SELECT count(*) FROM old)"
            ),
            // `$1` the job, `$2` the limit.
            recent_runs: format!(
                "SELECT record FROM {runs} WHERE job = $1::bytea AND id > 0 \
                 ORDER BY id DESC LIMIT $2::bigint"
            ),
            run_row: format!(
                "SELECT record FROM {runs} WHERE job = $1::bytea AND id = $2::bigint"
            ),
            set_control: format!(
                "INSERT INTO {runs} (job, id, record) VALUES ($1::bytea, {CONTROL}, $2::bytea) \
                 ON CONFLICT (job, id) DO UPDATE SET record = EXCLUDED.record"
            ),
            // Fire-time claims: one statement, its own transaction. The insert (or the
            // update of a job's row whose fire time is older) is the claim, answered by its
            // `RETURNING`; a refused claim's `ON CONFLICT` locked the row it compared with,
            // the newest version (after waiting for a concurrent claim to commit), and
            // `old` reads it with `FOR SHARE`, which in READ COMMITTED also follows to the
            // newest version rather than the statement's snapshot. Only a row inserted by a
            // claim that committed after this statement's snapshot was taken is out of its
            // sight: then no row comes back, and the caller reads the claim right after
            // (`current_claim`, a new snapshot). Time: `clock_timestamp()`, the database's
            // clock when it is read (not `now()`, the transaction's start, which a claim
            // that waited for a concurrent one would answer from before its wait); the
            // answer's is read last, after the claim.
            claim: format!(
                "WITH up AS (INSERT INTO {fires} AS kept (job, fire_ms, replica, claimed_at) \
                 VALUES ($1::bytea, $2::bigint, $3::bytea, clock_timestamp()) \
                 ON CONFLICT (job) DO UPDATE SET fire_ms = EXCLUDED.fire_ms, \
                 replica = EXCLUDED.replica, claimed_at = clock_timestamp() \
                 WHERE kept.fire_ms < EXCLUDED.fire_ms \
                 RETURNING fire_ms, replica, claimed_at), \
                 old AS (SELECT fire_ms, replica, claimed_at FROM {fires} \
                 WHERE job = $1::bytea AND NOT EXISTS (SELECT 1 FROM up) FOR SHARE) \
                 SELECT true, fire_ms, replica, claimed_at, clock_timestamp() FROM up \
                 UNION ALL \
                 SELECT false, fire_ms, replica, claimed_at, clock_timestamp() FROM old"
            ),
            current_claim: format!(
                "SELECT false, fire_ms, replica, claimed_at, clock_timestamp() FROM {fires} \
                 WHERE job = $1::bytea"
            ),
            // Leaders' values (`leaders.rs`): one statement, its own transaction. `h` finds
            // the lease row only while it holds the owner's grant of this fence unexpired by
            // the database's clock, and locks it `FOR SHARE` (in READ COMMITTED re-checked on
            // the newest version, and kept until commit): no release, hand-over or
            // take-over of the key can come between the check and the value's upsert. The
            // notice goes out at commit, on the release channel, as a release's does.
            publish: format!(
                "{now}, h AS (SELECT key FROM {table} WHERE key = $1::bytea \
                 AND owner = $2::text AND fence = $3::bigint \
                 AND expires_at > (SELECT t FROM now) FOR SHARE), \
                 up AS (INSERT INTO {leads} AS v (key, owner, term, value) \
                 SELECT key, $2::text, $3::bigint, $4::bytea FROM h \
                 ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, \
                 term = EXCLUDED.term, value = EXCLUDED.value RETURNING key), \
                 n AS (SELECT pg_notify($5::text, encode(key, 'hex')) FROM up) \
                 SELECT (SELECT count(*) FROM up), (SELECT count(*) FROM n)"
            ),
            // The unexpired holder's row joined with the value it published (a value left
            // by an earlier holder has another owner and term).
            leader: format!(
                "{now} SELECT v.value, v.term, v.owner, {LEFT} FROM {table} l \
                 JOIN {leads} v ON v.key = l.key AND v.owner = l.owner AND v.term = l.fence \
                 WHERE l.key = $1::bytea AND l.expires_at > (SELECT t FROM now)"
            ),
            announce: "SELECT pg_notify($2::text, encode($1::bytea, 'hex'))".to_owned(),
            exists:
                "SELECT to_regclass($1::text) IS NOT NULL AND to_regclass($2::text) IS NOT NULL \
                     AND to_regclass($3::text) IS NOT NULL AND to_regclass($5::text) IS NOT NULL \
                     AND to_regclass($6::text) IS NOT NULL AND to_regclass($7::text) IS NOT NULL \
                     AND to_regclass($8::text) IS NOT NULL AND to_regclass($9::text) IS NOT NULL \
                     AND to_regprocedure($10::text) IS NOT NULL \
                     AND to_regprocedure($11::text) IS NOT NULL \
                     AND to_regprocedure($12::text) IS NOT NULL \
                     AND to_regprocedure($13::text) IS NOT NULL, \
                     EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $4::text)"
                    .to_owned(),
            create: vec![
                // One creator at a time: concurrent `CREATE … IF NOT EXISTS` can still
                // collide in the catalog.
                "SELECT pg_advisory_xact_lock(7366120948823310921)".to_owned(),
                format!(
                    "CREATE TABLE IF NOT EXISTS {table} (\
                     key bytea PRIMARY KEY, owner text NOT NULL, fence bigint NOT NULL, \
                     expires_at timestamptz NOT NULL, awaited boolean NOT NULL DEFAULT false)"
                ),
                format!("CREATE SEQUENCE IF NOT EXISTS {sequence}"),
                format!(
                    "CREATE UNLOGGED TABLE IF NOT EXISTS {raw} (\
                     key bytea PRIMARY KEY, value text NOT NULL, expires_at timestamptz NOT NULL)",
                    raw = raw_table(names)
                ),
                // A job's history rows take ids from the column's sequence (from 1, in the
                // order they were stored), each with its slot and whether it is a success;
                // reserved rows below 1 (`LAST_SUCCESS`, `LAST_FAILURE`, `CONTROL`) have
                // neither, and no trim deletes them. The primary key serves every
                // statement; the unique index on `(job, slot)` the upsert of a slot.
                format!(
                    "CREATE TABLE IF NOT EXISTS {runs} (\
                     job bytea NOT NULL, id bigserial NOT NULL, record bytea NOT NULL, \
                     slot text, ok boolean, PRIMARY KEY (job, id))"
                ),
                // A table made by a version before slots gets the columns: its rows keep a
                // NULL slot (never replaced) and a NULL `ok` (classified by their bytes,
                // `IS_OK`). `exists` looks for the index, so such a table is upgraded on
                // connect.
                format!(
                    "ALTER TABLE {runs} ADD COLUMN IF NOT EXISTS slot text, \
                     ADD COLUMN IF NOT EXISTS ok boolean"
                ),
                format!(
                    "CREATE UNIQUE INDEX IF NOT EXISTS \"{bare_table}_slots\" ON {runs} (job, slot)"
                ),
                // One row per holder of permits (see `permits.rs`): what it takes of the
                // key's `of`, its fence (from the lease table's sequence) and expiry.
                format!(
                    "CREATE TABLE IF NOT EXISTS {perms} (\
                     key bytea NOT NULL, owner text NOT NULL, \
                     take integer NOT NULL CHECK (take > 0), of integer NOT NULL CHECK (of >= take), \
                     fence bigint NOT NULL, expires_at timestamptz NOT NULL, \
                     PRIMARY KEY (key, owner))"
                ),
                // One row per job, never deleted by the backend: the newest fire time
                // claimed (ms since the Unix epoch, never negative), by which replica, on
                // the database's clock when.
                format!(
                    "CREATE TABLE IF NOT EXISTS {fires} (\
                     job bytea PRIMARY KEY, fire_ms bigint NOT NULL CHECK (fire_ms >= 0), \
                     replica bytea NOT NULL, \
                     claimed_at timestamptz NOT NULL)"
                ),
                // One row per election, never deleted by the backend: the value its last
                // publishing leader (owner, term: the grant's fence) published.
                format!(
                    "CREATE TABLE IF NOT EXISTS {leads} (\
                     key bytea PRIMARY KEY, owner text NOT NULL, term bigint NOT NULL, \
                     value bytea NOT NULL)"
                ),
            ],
            create_schema: format!("CREATE SCHEMA IF NOT EXISTS {schema}"),
            permits: PermitsSql::new(names, &next, class),
        }
    }
}

/// `"schema"."table_raw"`: the raw baseline's table, beside the lease table.
pub(crate) fn raw_table(names: &Names) -> String {
    format!("\"{}\".\"{}_raw\"", names.raw_schema, names.raw_table)
}
