//! PostgreSQL backend against its peers on one `postgres` started by lock-testkit, in the
//! same run: the pattern users write by hand, a `pg_try_advisory_lock` /
//! `pg_advisory_unlock` pair on one connection per task (no TTL, no fencing, no notices:
//! a waiter polls every millisecond), and the raw protocol (an insert-if-absent and a
//! delete on a plain logged table, as durable as distlock's lease table: two statements,
//! no lease logic; issue 30's goal at one task is 0.95 of it), and `raw-lease`: distlock's
//! own grant and release statements (`lock_postgres::lock_statements`) sent in a plain loop
//! on one connection, the same server work with no library around it (the bound of `ours`),
//! on the workloads of every bench
//! (see `common`), distlock's guards ended by `release().await` and by drop. Server CPU is
//! the postmaster's and its backends'.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    named, rand_u128, ratio, Bench, Child, Distlock, End, Ratio, Settings, Subject, Workload,
    WORKLOADS,
};
use lock_testkit::PostgresServer;
use tokio_postgres::{Client, Statement};

/// Connections of the hand-written peer: one per task, as its users keep them.
const PEER_CONNECTIONS: usize = 64;

/// `pg_try_advisory_lock(hashtext(key))` until it answers true, then `pg_advisory_unlock`,
/// each task on a connection of its own (session locks belong to their connection), with
/// both statements prepared once per connection.
struct Advisory {
    free: Mutex<Vec<Session>>,
}

struct Session {
    client: Client,
    lock: Statement,
    unlock: Statement,
}

impl Session {
    async fn new(client: Client) -> Session {
        let lock = client
            .prepare("SELECT pg_try_advisory_lock(hashtext($1))")
            .await
            .expect("prepare");
        let unlock = client
            .prepare("SELECT pg_advisory_unlock(hashtext($1))")
            .await
            .expect("prepare");
        Session {
            client,
            lock,
            unlock,
        }
    }
}

impl Subject for Advisory {
    type Guard = (Session, Arc<str>);
    async fn lock(&self, key: Arc<str>) -> (Session, Arc<str>) {
        let session = self
            .free
            .lock()
            .unwrap()
            .pop()
            .expect("a connection per task");
        loop {
            let row = session
                .client
                .query_one(&session.lock, &[&&*key])
                .await
                .expect("pg_try_advisory_lock");
            if row.get::<_, bool>(0) {
                return (session, key);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, (session, key): (Session, Arc<str>)) {
        session
            .client
            .query_one(&session.unlock, &[&&*key])
            .await
            .expect("pg_advisory_unlock");
        self.free.lock().unwrap().push(session);
    }
}

/// The raw protocol: insert the key if absent (one statement), then delete it, both
/// prepared once.
struct RawTable {
    client: Client,
    insert: Statement,
    delete: Statement,
}

impl Subject for RawTable {
    type Guard = Arc<str>;
    async fn lock(&self, key: Arc<str>) -> Arc<str> {
        loop {
            let inserted = self
                .client
                .execute(&self.insert, &[&&*key])
                .await
                .expect("raw insert");
            if inserted == 1 {
                return key;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, key: Arc<str>) {
        self.client
            .execute(&self.delete, &[&&*key])
            .await
            .expect("raw delete");
    }
}

/// distlock's own grant and release statements, prepared once on one connection, in a
/// plain loop: a fresh owner per grant, a refused grant tried again after 1 ms.
struct RawLease {
    client: Client,
    acquire: Statement,
    release: Statement,
    channel: String,
}

impl RawLease {
    /// On the backend's default table of the server at `url` (made by a backend connected
    /// first).
    async fn connect(url: &str) -> Arc<RawLease> {
        drop(distlock::connect(url).await.expect("the tables made"));
        let (acquire, release, channel) = lock_postgres::lock_statements(
            lock_postgres::DEFAULT_SCHEMA,
            lock_postgres::DEFAULT_TABLE,
        )
        .expect("the default names");
        let client = client(url).await;
        let acquire = client.prepare(&acquire).await.expect("prepare");
        let release = client.prepare(&release).await.expect("prepare");
        Arc::new(RawLease {
            client,
            acquire,
            release,
            channel,
        })
    }
}

impl Subject for RawLease {
    type Guard = (Arc<str>, String);
    async fn lock(&self, key: Arc<str>) -> (Arc<str>, String) {
        let owner = format!("{:032x}", rand_u128());
        loop {
            let row = self
                .client
                .query_one(&self.acquire, &[&key.as_bytes(), &owner, &10_000_i64])
                .await
                .expect("raw-lease grant");
            if row.get::<_, bool>(0) {
                return (key, owner);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, (key, owner): (Arc<str>, String)) {
        self.client
            .query(&self.release, &[&key.as_bytes(), &owner, &self.channel])
            .await
            .expect("raw-lease release");
    }
}

fn ratios(w: Workload) -> Vec<Ratio> {
    let (goal, drop_goal, raw_goal) = match w {
        Workload::Lone => (Some(0.9), Some(0.95), Some(0.95)),
        Workload::Distinct(_) => (Some(1.0), Some(0.95), None),
        Workload::OneKey(..) => (None, None, None),
    };
    vec![
        ratio("ours", "advisory", goal),
        ratio("ours-drop", "advisory", goal),
        ratio("ours-drop", "ours", drop_goal),
        ratio("ours", "raw", raw_goal),
        ratio("raw-lease", "advisory", None),
        ratio("raw-lease", "raw", None),
        ratio("ours", "raw-lease", None),
    ]
}

/// A client of the server at `url` (`tokio_postgres::connect`, its connection driven by a
/// task of its own).
async fn client(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to postgres");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

#[tokio::main]
async fn main() {
    if let Some(child) = Child::from_env() {
        let url = child.target().to_owned();
        match child.subject() {
            "ours" => {
                child
                    .run(&Distlock::connect(&url, End::Release).await)
                    .await
            }
            "ours-drop" => child.run(&Distlock::connect(&url, End::Drop).await).await,
            "advisory" => {
                let mut peers = Vec::new();
                for _ in 0..PEER_CONNECTIONS {
                    peers.push(Session::new(client(&url).await).await);
                }
                let peer = Advisory {
                    free: Mutex::new(peers),
                };
                child.run(&Arc::new(peer)).await
            }
            "raw" => {
                let client = client(&url).await;
                client
                    .batch_execute("CREATE TABLE IF NOT EXISTS bench_raw (key text PRIMARY KEY)")
                    .await
                    .expect("raw table");
                let insert = client
                    .prepare("INSERT INTO bench_raw (key) VALUES ($1) ON CONFLICT (key) DO NOTHING")
                    .await
                    .expect("prepare");
                let delete = client
                    .prepare("DELETE FROM bench_raw WHERE key = $1")
                    .await
                    .expect("prepare");
                let raw = RawTable {
                    client,
                    insert,
                    delete,
                };
                child.run(&Arc::new(raw)).await
            }
            "raw-lease" => child.run(&RawLease::connect(&url).await).await,
            other => panic!("no subject {other}"),
        }
        return;
    }
    let server = PostgresServer::start().await;
    let bench = Bench {
        backend: "postgres",
        peers: "pg_try_advisory_lock + pg_advisory_unlock (a connection per task), a raw insert + delete, and raw-lease (distlock's statements in a plain loop), one postgres",
        subjects: vec![
            named("ours"),
            named("ours-drop"),
            named("advisory"),
            named("raw"),
            named("raw-lease"),
        ],
        target: server.url(),
        // The postmaster; each round counts the backends it forked for the round's child.
        servers: server.pid().into_iter().collect(),
        raw: Some("raw"),
        settings: Settings::from_args(),
    };
    let measured = bench.run(&WORKLOADS).await;
    bench.report(&measured, ratios);
}
