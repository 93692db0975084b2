//! The functions of claims of several permits on PostgreSQL, and the calls of them.

use crate::config::Names;

/// The claims of several permits (semaphores, reader-writer keys): four PL/pgSQL functions
/// created beside the lease table (`<table>_take`, `_renew`, `_give`, `_clear`), and one
/// prepared call of each, so that an operation is ONE statement, its own transaction, with
/// every value a parameter and the function's plans cached per connection.
///
/// Each function first takes the key's advisory lock, the same the lock's granting
/// statements take (`pg_advisory_xact_lock(class, hashtext(encode(key, 'hex')))`, held
/// until commit), and only then reads the time (`clock_timestamp()`, once) and the rows.
/// The functions are `VOLATILE`, so in READ COMMITTED each statement in them reads with a
/// new snapshot, taken after the lock was granted: it sees every earlier grant, extension
/// and release of the key's permits, all of which hold that lock too. (A single statement
/// could not: its snapshot is taken before it waits for the lock; nor could a `STABLE`
/// function, which keeps the calling statement's snapshot.)
///
/// Layout: each holder is a row of `<table>_perms` (`key, owner, take, of, fence,
/// expires_at`). While any holds, the lease table keeps a **marker row** for the key:
/// owner `*<of>` (no owner token starts with `*`), the newest holder's fence, and the
/// latest holder's expiry, which every function keeps exactly (the latest live holder's,
/// deleted with the last). The lock's statements thus see a key held with permits as a
/// live row they neither take over nor release (told apart by its `*`), and a marker
/// expires exactly when the last holder does.
///
/// A function is created once per database and found by its signature on connect
/// (`exists` in `sql.rs`): a change to a body must come with a new name or signature, or
/// databases made before it keep the old one.
#[derive(Debug)]
pub(crate) struct PermitsSql {
    /// `acquire`'s call: `$1` the key, `$2` the owner, `$3` take, `$4` of, `$5` the TTL in
    /// milliseconds. One row: `verdict, fence, of, left`, where `verdict` is
    /// - `grant`: a new holder's row, with the next fence of the sequence;
    /// - `again`: the owner holds already (a request re-sent after a lost reply): same
    ///   fence, fresh expiry;
    /// - `full`: the live holders leave fewer than `take` free; `left` is the time until
    ///   the first of them expires (ms); the marker is marked awaited (its next release is
    ///   announced);
    /// - `lock`: a live lock holds the key;
    /// - `of`: the live holders claim `of` (another number of permits).
    ///
    /// Expired holders' rows are deleted first.
    pub(crate) acquire: String,
    /// `extend`'s call: `$1` the key, `$2` the owner, `$3` the TTL in milliseconds. Pushes
    /// the owner's expiry to the TTL from now if it holds unexpired, and the marker's to
    /// the latest holder's. One row: how many holder rows and markers changed (held: `1,
    /// 1`).
    pub(crate) extend: String,
    /// `release`'s call: `$1` the key, `$2` the owner, `$3` the release channel. Deletes
    /// the owner's holder row (expired or not), and sets the marker's expiry to the latest
    /// remaining live holder's, or deletes it when none remains; announces the release
    /// when the marker was awaited. One row: whether the deleted row was live, `NULL` when
    /// there was none.
    pub(crate) release: String,
    /// `force_release`'s call: `$1` the key, `$2` the release channel. Deletes every grant
    /// of the key, the lock's row (or the marker) and every holder of permits, and
    /// announces it when something was there. One row: whether a live grant was deleted,
    /// whether anything was (and so announced).
    pub(crate) force_release: String,
    /// `CREATE OR REPLACE FUNCTION` of each function, for the creating transaction.
    pub(crate) create: Vec<String>,
    /// Each function's `regprocedure` text (`"schema"."name"(types)`), which `exists`
    /// looks for.
    pub(crate) signatures: [String; 4],
}

/// The parameters and results of the functions. None shares a name with a column (PL/pgSQL
/// would not know which is meant): parameters are `p_…`, results named for what they hold.
const TAKE_ARGS: &str = "p_key bytea, p_owner text, p_take integer, p_of integer, \
                         p_ttl_ms bigint, OUT verdict text, OUT granted_fence bigint, \
                         OUT live_of integer, OUT left_ms bigint";
const RENEW_ARGS: &str =
    "p_key bytea, p_owner text, p_ttl_ms bigint, OUT renewed bigint, OUT marked bigint";
const GIVE_ARGS: &str = "p_key bytea, p_owner text, p_channel text";
const CLEAR_ARGS: &str = "p_key bytea, p_channel text, OUT was_live boolean, OUT removed boolean";

impl PermitsSql {
    /// The functions of the lease table in `names` (its holders' table `names.perms`), with
    /// the fence sequence's `nextval` text `next` and the advisory locks' `class`.
    pub(crate) fn new(names: &Names, next: &str, class: i32) -> Self {
        let Names {
            table,
            perms,
            raw_schema,
            raw_table,
            ..
        } = names;
        // A validated identifier, quoted as every name of `Names`; `_renew` and `_clear`
        // are as long as `_fence`, so they fit beside the longest table name.
        let function = |suffix: &str| format!("\"{raw_schema}\".\"{raw_table}_{suffix}\"");
        let (take, renew, give, clear) = (
            function("take"),
            function("renew"),
            function("give"),
            function("clear"),
        );
        let lock = format!(
            "PERFORM pg_advisory_xact_lock({class}, hashtext(encode(p_key, 'hex')));\n  \
             t := clock_timestamp();"
        );
        // A holder's row is live while `expires_at > t`; the marker is the key's row of
        // the lease table whose owner starts with `*`.
        let marker = "key = p_key AND left(owner, 1) = '*'";
        // `use_variable`: a name that is both a local and a relation of the statement (a
        // lease table named `t`, read as its whole row) is the local. No column is named
        // like a local, a parameter or a result.
        //
        // Index scans only: every cycle leaves a dead holder row and a dead marker row of
        // the key behind. A bitmap scan of the key's range never marks dead index entries
        // as such, so they pile up until a vacuum and every scan of the key walks all of
        // them (measured: 0.8 ms per scan after 14,000 cycles on one key); a sequential
        // scan, which the planner picks for these small tables, reads every dead row of
        // the table (measured: a sixth of the server's time per cycle). A plain index scan
        // reads the key's entries only and marks the dead ones as it passes: later scans
        // skip them and inserts reclaim their space (the index stayed at 2 pages over
        // 80,000 cycles). The settings are the function's own, restored at its end.
        let create = |name: &str, args: &str, returns: &str, declare: &str, body: &str| {
            format!(
                "CREATE OR REPLACE FUNCTION {name}({args}){returns} \
                 LANGUAGE plpgsql VOLATILE \
                 SET enable_bitmapscan = off SET enable_seqscan = off AS $distlock$\n\
                 #variable_conflict use_variable\n\
                 DECLARE\n  t timestamptz;\n{declare}\
                 BEGIN\n  {lock}\n{body}\
                 END\n$distlock$"
            )
        };
        let create = vec![
            create(
                &take,
                TAKE_ARGS,
                "",
                "  ttl interval;\n  marker text;\n  holders bigint;\n  taken bigint;\n  \
                 soonest timestamptz;\n  others timestamptz;\n  mine bigint;\n  \
                 expiry timestamptz;\n",
                &format!(
                    "  ttl := p_ttl_ms * interval '1 millisecond';
  marker := '*' || p_of;
  DELETE FROM {perms} WHERE key = p_key AND expires_at <= t;
  SELECT count(*), coalesce(sum(take), 0), max(of), min(expires_at),
    max(expires_at) FILTER (WHERE owner <> p_owner),
    max(fence) FILTER (WHERE owner = p_owner)
    INTO holders, taken, live_of, soonest, others, mine
    FROM {perms} WHERE key = p_key AND expires_at > t;
  left_ms := GREATEST(0, CEIL(EXTRACT(EPOCH FROM (soonest - t)) * 1000))::bigint;
  IF EXISTS (SELECT 1 FROM {table} WHERE key = p_key AND expires_at > t
             AND left(owner, 1) <> '*') THEN
    verdict := 'lock';
  ELSIF holders > 0 AND live_of <> p_of THEN
    verdict := 'of';
  ELSIF mine IS NOT NULL THEN
    verdict := 'again';
    UPDATE {perms} SET expires_at = t + ttl WHERE key = p_key AND owner = p_owner
      RETURNING fence, expires_at INTO granted_fence, expiry;
  ELSIF taken + p_take > p_of THEN
    verdict := 'full';
    UPDATE {table} SET awaited = true WHERE key = p_key AND owner = marker;
  ELSE
    verdict := 'grant';
    INSERT INTO {perms} (key, owner, take, of, fence, expires_at)
      VALUES (p_key, p_owner, p_take, p_of, {next}, t + ttl)
      ON CONFLICT (key, owner) DO UPDATE SET take = EXCLUDED.take, of = EXCLUDED.of,
        fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at
      RETURNING fence, expires_at INTO granted_fence, expiry;
  END IF;
  IF verdict IN ('grant', 'again') THEN
    -- The marker: this holder's fence (never lowered while it stays the same marker),
    -- the latest holder's expiry; it replaces an expired lock's row.
    INSERT INTO {table} AS l (key, owner, fence, expires_at, awaited)
      VALUES (p_key, marker, granted_fence, GREATEST(expiry, others), false)
      ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner,
        fence = GREATEST(EXCLUDED.fence, CASE WHEN l.owner = EXCLUDED.owner THEN l.fence END),
        expires_at = EXCLUDED.expires_at,
        awaited = l.owner = EXCLUDED.owner AND l.awaited;
  END IF;
"
                ),
            ),
            create(
                &renew,
                RENEW_ARGS,
                "",
                "  expiry timestamptz;\n  last timestamptz;\n",
                &format!(
                    "  UPDATE {perms} SET expires_at = t + p_ttl_ms * interval '1 millisecond'
    WHERE key = p_key AND owner = p_owner AND expires_at > t
    RETURNING expires_at INTO expiry;
  GET DIAGNOSTICS renewed = ROW_COUNT;
  marked := 0;
  IF renewed > 0 THEN
    SELECT max(expires_at) INTO last FROM {perms}
      WHERE key = p_key AND owner <> p_owner AND expires_at > t;
    UPDATE {table} SET expires_at = GREATEST(last, expiry) WHERE {marker};
    GET DIAGNOSTICS marked = ROW_COUNT;
  END IF;
"
                ),
            ),
            create(
                &give,
                GIVE_ARGS,
                " RETURNS boolean",
                "  was_live boolean;\n  last timestamptz;\n  was_awaited boolean;\n",
                &format!(
                    "  DELETE FROM {perms} WHERE key = p_key AND owner = p_owner
    RETURNING expires_at > t INTO was_live;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  SELECT max(expires_at) INTO last FROM {perms}
    WHERE key = p_key AND owner <> p_owner AND expires_at > t;
  SELECT awaited INTO was_awaited FROM {table} WHERE {marker};
  IF last IS NULL THEN
    DELETE FROM {table} WHERE {marker};
  ELSE
    UPDATE {table} SET expires_at = last, awaited = false WHERE {marker};
  END IF;
  IF was_awaited THEN
    PERFORM pg_notify(p_channel, encode(p_key, 'hex'));
  END IF;
  RETURN was_live;
"
                ),
            ),
            create(
                &clear,
                CLEAR_ARGS,
                "",
                "",
                &format!(
                    "  WITH p AS (DELETE FROM {perms} WHERE key = p_key
      RETURNING expires_at > t AS live),
    l AS (DELETE FROM {table} WHERE key = p_key RETURNING expires_at > t AS live),
    gone AS (SELECT live FROM p UNION ALL SELECT live FROM l)
  SELECT coalesce(bool_or(live), false), count(*) > 0 INTO was_live, removed FROM gone;
  IF removed THEN
    PERFORM pg_notify(p_channel, encode(p_key, 'hex'));
  END IF;
"
                ),
            ),
        ];
        PermitsSql {
            acquire: format!(
                "SELECT verdict, granted_fence, live_of, left_ms FROM {take}($1::bytea, \
                 $2::text, $3::integer, $4::integer, $5::bigint)"
            ),
            extend: format!("SELECT renewed, marked FROM {renew}($1::bytea, $2::text, $3::bigint)"),
            release: format!("SELECT {give}($1::bytea, $2::text, $3::text)"),
            force_release: format!("SELECT was_live, removed FROM {clear}($1::bytea, $2::text)"),
            create,
            signatures: [
                format!("{take}(bytea, text, integer, integer, bigint)"),
                format!("{renew}(bytea, text, bigint)"),
                format!("{give}(bytea, text, text)"),
                format!("{clear}(bytea, text)"),
            ],
        }
    }
}
