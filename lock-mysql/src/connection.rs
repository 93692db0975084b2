//! The lock connections: a few `mysql_async` connections taken in turn, each replaced after
//! it broke or timed out (its server session ended before the next request), every request
//! bounded by the operation timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::config::{MysqlBuilder, Names, CONNECTIONS};
use crate::error::{code, Failure, RequestError};
use crate::sql::Sql;

/// How long an idle connection is trusted without a ping. The client reads nothing while
/// no request is on its way, so it cannot see a connection the server ended meanwhile (a
/// restart, `wait_timeout`); a request sent there would fail, and sending it again could
/// not be told apart from running it twice. A connection in steady use (under load, a
/// loop of cycles) is never pinged; one idle for longer costs a round trip first.
const TRUSTED_IDLE: Duration = Duration::from_millis(100);

/// One open connection.
struct Live {
    conn: Conn,
    /// The server's session of it, to end it after giving it up.
    session: Session,
    /// When it last answered.
    last_used: Instant,
}

/// A server session: its connection id, its client address as the server shows it
/// (`host:port` in the process list), and when the server it runs on started (seconds
/// since the Unix epoch), so that a restarted server's reuse of the id is never ended.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Session {
    id: u32,
    host: String,
    booted: i64,
}

/// The connections of one backend.
pub(crate) struct Connection {
    opts: mysql_async::Opts,
    pub(crate) sql: Sql,
    pub(crate) addr: String,
    pub(crate) timeout: Duration,
    idle: Mutex<Vec<Live>>,
    /// At most [`CONNECTIONS`] requests at once, one per connection.
    slots: Semaphore,
    /// Sessions of connections given up after a timeout or a break, ended before the next
    /// request is sent: a request still on its way there could otherwise run after
    /// requests sent since (an acquisition granted after its own clean-up).
    abandoned: Mutex<Vec<Session>>,
    /// One request at a time ends the sessions given up.
    ending: tokio::sync::Mutex<()>,
}

impl Connection {
    pub(crate) fn new(builder: &MysqlBuilder, names: Names) -> Connection {
        Connection {
            opts: builder.client_opts(),
            sql: Sql::new(&names),
            addr: builder.host_port().to_string(),
            timeout: builder.get_timeout(),
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(CONNECTIONS),
            abandoned: Mutex::new(Vec::new()),
            ending: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn error(&self, op: &'static str, failure: Failure) -> RequestError {
        RequestError {
            addr: self.addr.clone(),
            op,
            failure,
            timeout: self.timeout,
        }
    }

    /// Runs `script` (see `sql.rs`) on a connection, connecting first if needed, all within
    /// one operation timeout; answers the rows of its result sets. A script that failed is
    /// sent again only as `again` allows (one attempt with [`Again::Never`]); otherwise a
    /// deadlock, which the server rolled back whole, is the transient [`Failure`] it is,
    /// and the Locker's waiting policy decides whether to try again. After a server error
    /// the transaction it may have left open is rolled back.
    ///
    /// Cancelling it gives the connection of the attempt in flight up (its session is
    /// ended before the next request), so nothing sent on it can run after what is sent
    /// next.
    pub(crate) async fn script(
        &self,
        op: &'static str,
        script: &str,
        again: Again,
    ) -> Result<Vec<Row>, RequestError> {
        let deadline = Instant::now() + self.timeout;
        let mut restarts = 0;
        let mut trust_idle = true;
        loop {
            match self.script_within(op, script, deadline, trust_idle).await {
                Err(failed)
                    if again == Again::IfDeadlock
                        && failed.error.failure.is_deadlock()
                        && restarts < DEADLOCK_RESTARTS
                        && Instant::now() < deadline =>
                {
                    restarts += 1;
                }
                // Sent again once, on a connection pinged first or new (then nothing is
                // unchecked, so it is not found `closed_unseen` again).
                Err(failed)
                    if again == Again::IfClosedUnseen
                        && failed.closed_unseen
                        && Instant::now() < deadline =>
                {
                    trust_idle = false;
                }
                answer => return answer.map_err(|failed| failed.error),
            }
        }
    }

    /// One attempt of [`script`](Self::script), its steps bounded by `deadline`; a
    /// connection idle for a short while is reused without a ping when `trust_idle`.
    async fn script_within(
        &self,
        op: &'static str,
        script: &str,
        deadline: Instant,
        trust_idle: bool,
    ) -> Result<Vec<Row>, Failed> {
        let failed = |failure| Failed {
            error: self.error(op, failure),
            closed_unseen: false,
        };
        let Ok(_slot) = tokio::time::timeout_at(deadline, self.slots.acquire()).await else {
            return Err(failed(Failure::Timeout("waiting for a free connection")));
        };
        let (live, unchecked) =
            match tokio::time::timeout_at(deadline, self.ready(trust_idle)).await {
                Ok(Ok(ready)) => ready,
                Ok(Err(failure)) => return Err(failed(failure)),
                Err(_) => {
                    return Err(failed(Failure::Timeout(
                        "connecting, pinging or ending given-up sessions",
                    )))
                }
            };
        // Given up (the script running) until it answers: a dropped future drops it here.
        let mut guard = GiveUp {
            connection: self,
            live: Some(live),
        };
        let conn = &mut guard.live.as_mut().expect("held until returned").conn;
        let failure = match tokio::time::timeout_at(deadline, run(conn, script)).await {
            Ok(Ok(rows)) => {
                guard.keep();
                return Ok(rows);
            }
            Ok(Err(failure)) => failure,
            Err(_) => Failure::Timeout("waiting for the script's answer"),
        };
        if failure.breaks_connection() {
            return Err(Failed {
                closed_unseen: unchecked && failure.is_closed(),
                error: self.error(op, failure),
            });
        }
        // A server error: the rest of the script was skipped; end its transaction.
        let conn = &mut guard.live.as_mut().expect("held until returned").conn;
        let rolled_back = tokio::time::timeout_at(deadline, conn.query_drop("ROLLBACK")).await;
        if matches!(rolled_back, Ok(Ok(()))) {
            guard.keep();
        }
        Err(failed(failure))
    }

    /// Connects now (for `build`): checks the server's version, creates the tables.
    pub(crate) async fn check(&self) -> Result<(), RequestError> {
        let deadline = Instant::now() + self.timeout;
        let checked = tokio::time::timeout_at(deadline, async {
            let mut live = self.connect().await?;
            let (version, flush): (String, i64) = live
                .conn
                .query_first("SELECT VERSION(), @@innodb_flush_log_at_trx_commit")
                .await
                .map_err(Failure::Client)?
                .ok_or_else(|| Failure::Reply("no answer to SELECT VERSION()".into()))?;
            check_version(&version).map_err(Failure::Reply)?;
            if flush != 1 {
                tracing::warn!(
                    innodb_flush_log_at_trx_commit = flush,
                    "a crash of the database host may lose the last grants (and reissue \
                     their fences): set innodb_flush_log_at_trx_commit = 1"
                );
            }
            // Read to the closing frame, so that an error of any statement comes through.
            run(&mut live.conn, &self.sql.create()).await?;
            live.last_used = Instant::now();
            lock(&self.idle).push(live);
            Ok(())
        })
        .await;
        match checked {
            Ok(Ok(())) => Ok(()),
            Ok(Err(failure)) => Err(self.error("connect", failure)),
            Err(_) => Err(self.error("connect", Failure::Timeout("connecting"))),
        }
    }

    /// A connection ready for a request: an idle one (pinged first when idle for long), or
    /// a new one; after the sessions of connections given up were ended.
    async fn ready(&self, trust_idle: bool) -> Result<(Live, bool), Failure> {
        let (mut live, unchecked) = loop {
            let idle = lock(&self.idle).pop();
            match idle {
                Some(live) if trust_idle && live.last_used.elapsed() <= TRUSTED_IDLE => {
                    break (live, true);
                }
                Some(mut live) => {
                    if live.conn.ping().await.is_ok() {
                        break (live, false);
                    }
                    // Ended by the server (a restart): nothing was on its way there.
                }
                None => break (self.connect().await?, false),
            }
        };
        let _one = self.ending.lock().await;
        let abandoned = lock(&self.abandoned).clone();
        if !abandoned.is_empty() {
            if let Err(failure) = end_sessions(&mut live, &abandoned, self.timeout / 2).await {
                if failure.breaks_connection() {
                    self.give_up(live.session);
                }
                return Err(failure);
            }
            lock(&self.abandoned).retain(|s| !abandoned.contains(s));
        }
        Ok((live, unchecked))
    }

    /// Opens a connection: UTC for the session's time functions, READ COMMITTED (no gap
    /// locks beyond the duplicate checks), row-lock waits bounded near the timeout.
    async fn connect(&self) -> Result<Live, Failure> {
        let mut conn = Conn::new(self.opts.clone())
            .await
            .map_err(Failure::Client)?;
        let wait_s = self.timeout.as_secs().clamp(1, 3600);
        let rows = run(
            &mut conn,
            &format!(
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
                 SET time_zone = '+00:00', autocommit = 1, innodb_lock_wait_timeout = {wait_s}; \
                 SHOW GLOBAL STATUS LIKE 'Uptime'; \
                 SELECT CONNECTION_ID(), CAST(UNIX_TIMESTAMP() AS SIGNED), \
                 (SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID())"
            ),
        )
        .await?;
        let [uptime, me] = rows.as_slice() else {
            return Err(Failure::Reply(format!(
                "{} rows from the session's set-up",
                rows.len()
            )));
        };
        let uptime: i64 = column(uptime, 1)?;
        let (id, now): (u32, i64) = (column(me, 0)?, column(me, 1)?);
        let host: String = column::<Option<String>>(me, 2)?.unwrap_or_default();
        Ok(Live {
            conn,
            session: Session {
                id,
                host,
                booted: now - uptime,
            },
            last_used: Instant::now(),
        })
    }

    /// Forgets a connection that timed out or broke: its session is ended before the next
    /// request.
    fn give_up(&self, session: Session) {
        lock(&self.abandoned).push(session);
    }
}

/// A connection whose request has not answered yet: given up if dropped.
struct GiveUp<'a> {
    connection: &'a Connection,
    live: Option<Live>,
}

impl GiveUp<'_> {
    /// The request answered: the connection goes back to the idle ones.
    fn keep(&mut self) {
        if let Some(mut live) = self.live.take() {
            live.last_used = Instant::now();
            lock(&self.connection.idle).push(live);
        }
    }
}

impl Drop for GiveUp<'_> {
    fn drop(&mut self) {
        if let Some(live) = self.live.take() {
            self.connection.give_up(live.session);
        }
    }
}

/// Ends each of `sessions` (`KILL CONNECTION`), on the same server incarnation only, and
/// waits until they are gone from the process list, within `patience`.
async fn end_sessions(
    live: &mut Live,
    sessions: &[Session],
    patience: Duration,
) -> Result<(), Failure> {
    let deadline = Instant::now() + patience;
    let mut waiting = Vec::new();
    for session in sessions {
        // A session of a server since restarted ended with it; its id may be another's now.
        if (session.booted - live.session.booted).abs() > 2 || session.id == live.session.id {
            continue;
        }
        // Still the same session (a restart within seconds reuses ids, the client's
        // address tells them apart)? The address is the server's own text: matched only
        // when it is plain.
        let plain = session
            .host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".:-_[]".contains(&b));
        if plain {
            let same: Option<i64> = live
                .conn
                .query_first(format!(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                     WHERE ID = {} AND HOST = '{}'",
                    session.id, session.host
                ))
                .await
                .map_err(Failure::Client)?;
            if same.unwrap_or(0) == 0 {
                continue;
            }
        }
        let killed = live
            .conn
            .query_drop(format!("KILL CONNECTION {}", session.id))
            .await;
        match killed {
            Ok(()) => waiting.push(session.id),
            Err(mysql_async::Error::Server(s)) if s.code == code::NO_SUCH_THREAD => {}
            Err(e) => return Err(Failure::Client(e)),
        }
    }
    if waiting.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = waiting.iter().map(u32::to_string).collect();
    let query = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID IN ({})",
        ids.join(", ")
    );
    loop {
        let left: Option<i64> = tokio::time::timeout_at(deadline, live.conn.query_first(&query))
            .await
            .map_err(|_| Failure::Timeout("ending given-up sessions"))?
            .map_err(Failure::Client)?;
        if left.unwrap_or(0) == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Failure::Timeout("ending given-up sessions"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    lock_core::sync::lock(mutex)
}

/// When [`Connection::script`] sends a script that failed again, within its one operation
/// timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Again {
    /// Never: one attempt (a script whose second run could answer otherwise than its first,
    /// a forced release, a baseline step).
    Never,
    /// Once, when the connection, reused without a ping (used within the last
    /// [`TRUSTED_IDLE`]), turned out closed by the server (a restart, `KILL CONNECTION`, a
    /// proxy): on a connection pinged first or new. For scripts whose second run answers
    /// as the first would have: an acquisition (re-entrant for its owner: a grant whose
    /// answer was lost is renewed with the same fence), an extension, a read. The closed
    /// session is ended before the second is sent, as every given-up session is.
    IfClosedUnseen,
    /// Up to [`DEADLOCK_RESTARTS`] more times when the server rolled it back for a
    /// deadlock (error 1213: nothing of it happened, and the server asks for exactly this,
    /// "try restarting transaction"). For releases and hand-overs: nothing above them tries
    /// again, and without it a release that met a deadlock with a concurrent grouped script
    /// (InnoDB's duplicate-key checks take locks of their own) failed, and the lock stayed
    /// held until its TTL. An acquisition is one attempt there (the Locker's waiting policy
    /// tries again).
    IfDeadlock,
}

/// A failed attempt of a script.
struct Failed {
    error: RequestError,
    /// The connection was reused without a ping and found closed by the server.
    closed_unseen: bool,
}

/// How many more times a release or a hand-over rolled back by a deadlock is sent
/// ([`Again::IfDeadlock`]).
const DEADLOCK_RESTARTS: u32 = 3;

/// Numbers the scripts sent, for their frames.
static FRAMES: AtomicU64 = AtomicU64::new(1);

/// Runs a script and answers the rows of all its result sets, in order.
///
/// The script is framed by `SELECT 'distlock-frame-n'` before and after it, with `n` new
/// for each script, and the answer is read until the closing frame: `mysql_async` reports
/// "no more results" while the error of a statement after a result set is still unread
/// (a deadlock in the `DELETE` after a release's `SELECT … FOR UPDATE`), so its word alone
/// would swallow the error and leave the transaction open. An answer without both frames
/// gives the connection up rather than being read as this script's.
async fn run(conn: &mut Conn, script: &str) -> Result<Vec<Row>, Failure> {
    let frame = format!("distlock-frame-{}", FRAMES.fetch_add(1, Ordering::Relaxed));
    let framed = format!("SELECT '{frame}'; {script}; SELECT '{frame}'");
    let mut result = conn.query_iter(framed).await.map_err(Failure::Client)?;
    let is_frame = |set: &[Row]| matches!(set, [row] if column::<String>(row, 0).ok().as_deref() == Some(frame.as_str()));
    let mut sets: Vec<Vec<Row>> = Vec::new();
    // Empty reads in a row with nothing more reported: the answer ended.
    let mut empty = 0;
    loop {
        let set: Vec<Row> = result.collect().await.map_err(Failure::Client)?;
        let closing = !sets.is_empty() && is_frame(&set);
        empty = if set.is_empty() && result.is_empty() {
            empty + 1
        } else {
            0
        };
        sets.push(set);
        if closing || empty > 1 {
            break;
        }
    }
    let whole = sets.len() >= 2
        && sets.first().is_some_and(|s| is_frame(s))
        && sets.last().is_some_and(|s| is_frame(s));
    if !whole {
        return Err(Failure::OutOfStep(format!(
            "the answer to a script is not its whole answer ({} result sets)",
            sets.len()
        )));
    }
    sets.pop();
    Ok(sets.into_iter().skip(1).flatten().collect())
}

/// Column `i` of `row` as `T`, or what the reply was instead.
pub(crate) fn column<T: mysql_async::prelude::FromValue>(
    row: &Row,
    i: usize,
) -> Result<T, Failure> {
    match row.get_opt::<T, usize>(i) {
        Some(Ok(value)) => Ok(value),
        Some(Err(e)) => Err(Failure::Reply(format!("unexpected reply: column {i}: {e}"))),
        None => Err(Failure::Reply(format!("unexpected reply: no column {i}"))),
    }
}

/// Refuses a server whose `AUTO_INCREMENT` counter is not persistent (it would go back to
/// the largest row's id + 1 after a restart, and the fences' table keeps no rows): MariaDB
/// before 10.3 (10.2.4 persists it, 10.2 is out of support) and MySQL before 8.0.
fn check_version(version: &str) -> Result<(), String> {
    let mariadb = version.contains("MariaDB");
    // MariaDB before 11 may answer with the replication prefix `5.5.5-`.
    let number = match version.strip_prefix("5.5.5-") {
        Some(rest) if mariadb => rest,
        _ => version,
    };
    let mut parts = number
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    let ok = if mariadb {
        (major, minor) >= (10, 3)
    } else {
        major >= 8
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "server version {version} is not supported: fences need a persistent \
             AUTO_INCREMENT (MariaDB 10.3 or newer, MySQL 8.0 or newer)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_with_persistent_auto_increment_are_accepted() {
        assert!(check_version("10.11.19-MariaDB-0+deb12u1").is_ok());
        assert!(check_version("11.4.2-MariaDB").is_ok());
        assert!(check_version("8.0.36").is_ok());
        assert!(check_version("8.4.0-commercial").is_ok());
        assert!(check_version("5.7.44-log").is_err());
        assert!(check_version("10.2.44-MariaDB").is_err());
        assert!(check_version("5.5.5-10.1.48-MariaDB").is_err());
        assert!(check_version("5.5.5-10.11.2-MariaDB").is_ok());
    }
}
