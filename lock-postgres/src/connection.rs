//! The lock connection: one `tokio_postgres` client with the statements prepared, replaced
//! after it broke or timed out, every request bounded by the operation timeout.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};

use crate::config::{Names, PostgresBuilder};
use crate::error::{Failure, RequestError};
use crate::sql::Sql;

/// The prepared statements of one connection.
pub(crate) struct Statements {
    pub(crate) acquire: Statement,
    pub(crate) acquire_many: Statement,
    pub(crate) extend: Statement,
    pub(crate) release: Statement,
    pub(crate) release_many: Statement,
    pub(crate) hand_over: Statement,
    pub(crate) hand_over_many: Statement,
    pub(crate) inspect: Statement,
    pub(crate) raw_set: Statement,
    pub(crate) raw_del: Statement,
    pub(crate) append_run: Statement,
    pub(crate) recent_runs: Statement,
    pub(crate) run_row: Statement,
    pub(crate) set_control: Statement,
    pub(crate) claim: Statement,
    pub(crate) current_claim: Statement,
    pub(crate) publish: Statement,
    pub(crate) leader: Statement,
    pub(crate) announce: Statement,
    /// The calls of the permits' functions (`permits_sql.rs`).
    pub(crate) acquire_permits: Statement,
    pub(crate) extend_permits: Statement,
    pub(crate) release_permits: Statement,
    pub(crate) force_release: Statement,
}

/// One open connection.
struct Live {
    client: Client,
    statements: Statements,
    /// The server process serving it, and when it started (`pg_stat_activity`), so that a
    /// replacement can end exactly this session and not one that reuses its pid.
    backend: (i32, String),
    task: AbortHandle,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The connection of one backend.
pub(crate) struct Connection {
    config: tokio_postgres::Config,
    pub(crate) names: Names,
    pub(crate) sql: Sql,
    pub(crate) addr: String,
    pub(crate) timeout: Duration,
    current: Mutex<Option<Arc<Live>>>,
    /// The session of a connection given up after a timeout or a break, ended by the next
    /// connection before it sends anything (see [`Connection::connect`]).
    abandoned: Mutex<Option<(i32, String)>>,
    /// One (re)connection at a time.
    connecting: tokio::sync::Mutex<()>,
}

impl Connection {
    pub(crate) fn new(builder: &PostgresBuilder, names: Names) -> Connection {
        Connection {
            config: builder.client_config(),
            sql: Sql::new(&names),
            names,
            addr: builder.host_port().to_string(),
            timeout: builder.get_timeout(),
            current: Mutex::new(None),
            abandoned: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn client_config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    pub(crate) fn error(&self, op: &'static str, failure: Failure) -> RequestError {
        RequestError {
            addr: self.addr.clone(),
            op,
            failure,
            timeout: self.timeout,
        }
    }

    /// Runs the prepared statement `pick` chooses with `params`, connecting first if
    /// needed, all within one operation timeout.
    ///
    /// Cancelling it leaves the connection usable: a request already written is answered
    /// and its answer dropped, and requests on one connection run in order.
    pub(crate) async fn query(
        &self,
        op: &'static str,
        pick: fn(&Statements) -> &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, RequestError> {
        let deadline = Instant::now() + self.timeout;
        let live = match tokio::time::timeout_at(deadline, self.live()).await {
            Ok(live) => live.map_err(|failure| self.error(op, failure))?,
            Err(_) => return Err(self.error(op, Failure::Timeout)),
        };
        let answer =
            tokio::time::timeout_at(deadline, live.client.query(pick(&live.statements), params))
                .await;
        let failure = match answer {
            Ok(Ok(rows)) => return Ok(rows),
            Ok(Err(e)) => Failure::Client(e),
            Err(_) => Failure::Timeout,
        };
        if failure.breaks_connection() {
            self.discard(&live);
        }
        Err(self.error(op, failure))
    }

    /// Connects now (for `build`): the first connection, its statements and the table.
    pub(crate) async fn check(&self) -> Result<(), RequestError> {
        match tokio::time::timeout(self.timeout, self.live()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(failure)) => Err(self.error("connect", failure)),
            Err(_) => Err(self.error("connect", Failure::Timeout)),
        }
    }

    /// Forgets `live` if it is still the current connection; its session is ended by the
    /// next connection.
    fn discard(&self, live: &Arc<Live>) {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, live)) {
            *current = None;
            *lock(&self.abandoned) = Some(live.backend.clone());
        }
    }

    async fn live(&self) -> Result<Arc<Live>, Failure> {
        if let Some(live) = self.usable() {
            return Ok(live);
        }
        let _one = self.connecting.lock().await;
        if let Some(live) = self.usable() {
            return Ok(live);
        }
        let live = Arc::new(self.connect().await?);
        *lock(&self.current) = Some(live.clone());
        Ok(live)
    }

    fn usable(&self) -> Option<Arc<Live>> {
        let mut current = lock(&self.current);
        match current.as_ref() {
            Some(live) if !live.client.is_closed() => Some(live.clone()),
            Some(live) => {
                *lock(&self.abandoned) = Some(live.backend.clone());
                *current = None;
                None
            }
            None => None,
        }
    }

    /// Opens a connection, ends the session of the one given up (a request that timed out
    /// there could otherwise still run after this connection's requests: an acquisition
    /// granted after its clean-up), makes the table if missing, and prepares the statements.
    async fn connect(&self) -> Result<Live, Failure> {
        let (client, connection) = self.config.connect(NoTls).await.map_err(Failure::Client)?;
        let task = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "postgres connection ended");
            }
        })
        .abort_handle();
        let setup = async {
            // Fences come from a sequence whose advance must be durable before the grant is
            // answered: a commit that waits for nothing could lose it in a crash.
            client
                .batch_execute(
                    "SELECT set_config('synchronous_commit', 'on', false) \
                     WHERE current_setting('synchronous_commit') = 'off'",
                )
                .await?;
            let me = client
                .query_one(
                    "SELECT pid, backend_start::text FROM pg_stat_activity \
                     WHERE pid = pg_backend_pid()",
                    &[],
                )
                .await?;
            let backend: (i32, String) = (me.try_get(0)?, me.try_get(1)?);
            let old = lock(&self.abandoned).take();
            if let Some((pid, started)) = &old {
                let wait_ms = i64::try_from(self.timeout.as_millis() / 2).unwrap_or(i64::MAX);
                let ended = client
                    .query(
                        "SELECT pg_terminate_backend(pid, $3::bigint) FROM pg_stat_activity \
                         WHERE pid = $1::int AND backend_start::text = $2::text",
                        &[pid, started, &wait_ms],
                    )
                    .await;
                if let Err(e) = ended {
                    tracing::debug!(error = %e, pid, "could not end the abandoned session");
                }
            }
            self.create_table(&client).await?;
            // Prepared together: the connection pipelines them, one round trip in all
            // (a reconnection after an outage fits in one operation timeout).
            let sql = &self.sql;
            let (acquire, acquire_many, extend, release, release_many) = futures::try_join!(
                client.prepare(&sql.acquire),
                client.prepare(&sql.acquire_many),
                client.prepare(&sql.extend),
                client.prepare(&sql.release),
                client.prepare(&sql.release_many),
            )?;
            let (hand_over, hand_over_many, inspect, raw_set, raw_del) = futures::try_join!(
                client.prepare(&sql.hand_over),
                client.prepare(&sql.hand_over_many),
                client.prepare(&sql.inspect),
                client.prepare(&sql.raw_set),
                client.prepare(&sql.raw_del),
            )?;
            let (append_run, recent_runs, run_row, set_control, claim) = futures::try_join!(
                client.prepare(&sql.append_run),
                client.prepare(&sql.recent_runs),
                client.prepare(&sql.run_row),
                client.prepare(&sql.set_control),
                client.prepare(&sql.claim),
            )?;
            let (current_claim, publish, leader, announce) = futures::try_join!(
                client.prepare(&sql.current_claim),
                client.prepare(&sql.publish),
                client.prepare(&sql.leader),
                client.prepare(&sql.announce),
            )?;
            let permits = &sql.permits;
            let (acquire_permits, extend_permits, release_permits, force_release) = futures::try_join!(
                client.prepare(&permits.acquire),
                client.prepare(&permits.extend),
                client.prepare(&permits.release),
                client.prepare(&permits.force_release),
            )?;
            let statements = Statements {
                acquire,
                acquire_many,
                extend,
                release,
                release_many,
                hand_over,
                hand_over_many,
                inspect,
                raw_set,
                raw_del,
                append_run,
                recent_runs,
                run_row,
                set_control,
                claim,
                current_claim,
                publish,
                leader,
                announce,
                acquire_permits,
                extend_permits,
                release_permits,
                force_release,
            };
            Ok::<_, tokio_postgres::Error>((backend, statements))
        };
        match setup.await {
            Ok((backend, statements)) => Ok(Live {
                client,
                statements,
                backend,
                task,
            }),
            Err(e) => {
                task.abort();
                Err(Failure::Client(e))
            }
        }
    }

    /// Creates the schema, the lease table, its sequence, the raw baseline's table, the
    /// permits' holders' table, the run records' table, the fire-time claims' table, the
    /// leaders' values' table and the permits' functions, when one is missing; upgrades a
    /// run records' table made by an older version (without the slot index) in the same
    /// transaction.
    async fn create_table(&self, client: &Client) -> Result<(), tokio_postgres::Error> {
        let names = &self.names;
        let row = client
            .query_one(
                &self.sql.exists,
                &[
                    &names.table,
                    &names.sequence,
                    &crate::sql::raw_table(names),
                    &names.raw_schema,
                    &names.runs,
                    &names.fires,
                    &names.perms,
                    &names.leads,
                    &names.slots,
                    &self.sql.permits.signatures[0],
                    &self.sql.permits.signatures[1],
                    &self.sql.permits.signatures[2],
                    &self.sql.permits.signatures[3],
                ],
            )
            .await?;
        let (all_there, schema_there): (bool, bool) = (row.try_get(0)?, row.try_get(1)?);
        if all_there {
            return Ok(());
        }
        let mut script = String::from("BEGIN;");
        let statements = self.sql.create.iter().chain(&self.sql.permits.create);
        for (i, statement) in statements.enumerate() {
            script.push_str(statement);
            script.push(';');
            if i == 0 && !schema_there {
                script.push_str(&self.sql.create_schema);
                script.push(';');
            }
        }
        script.push_str("COMMIT;");
        let created = client.batch_execute(&script).await;
        if created.is_err() {
            let _ = client.batch_execute("ROLLBACK").await;
        }
        created
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    lock_core::sync::lock(mutex)
}
