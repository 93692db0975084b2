//! MySQL/MariaDB backend against its peers on one `mariadbd` started by lock-testkit, in
//! the same run: the pattern users write by hand, a `GET_LOCK(key, 0)` /
//! `RELEASE_LOCK(key)` pair on one connection per task (no TTL, no fencing, no notices: a
//! waiter polls every millisecond), and the raw protocol (an `INSERT IGNORE` and a
//! `DELETE` on a plain InnoDB table: two statements, no lease logic), on the workloads of
//! every bench (see `common`), distlock's guards ended by `release().await` and by drop.
//! Server CPU is `mariadbd`'s (one process, a thread per connection).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    named, ratio, Bench, Child, Distlock, End, Ratio, Settings, Subject, Workload, WORKLOADS,
};
use lock_testkit::MariaDbServer;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Statement};

/// Connections of the hand-written peer: one per task, as its users keep them.
const PEER_CONNECTIONS: usize = 64;

/// `GET_LOCK(key, 0)` until it answers 1, then `RELEASE_LOCK(key)`, each task on a
/// connection of its own (named locks belong to their session), both statements prepared
/// once per connection.
struct NamedLocks {
    free: Mutex<Vec<Session>>,
}

struct Session {
    conn: Conn,
    lock: Statement,
    unlock: Statement,
}

impl Session {
    async fn new(mut conn: Conn) -> Session {
        let lock = conn.prep("SELECT GET_LOCK(?, 0)").await.expect("prepare");
        let unlock = conn.prep("SELECT RELEASE_LOCK(?)").await.expect("prepare");
        Session { conn, lock, unlock }
    }
}

impl Subject for NamedLocks {
    type Guard = (Session, Arc<str>);
    async fn lock(&self, key: Arc<str>) -> (Session, Arc<str>) {
        let mut session = self
            .free
            .lock()
            .unwrap()
            .pop()
            .expect("a connection per task");
        loop {
            let got: Option<i64> = session
                .conn
                .exec_first(&session.lock, (&*key,))
                .await
                .expect("GET_LOCK");
            if got == Some(1) {
                return (session, key);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, (mut session, key): (Session, Arc<str>)) {
        let _: Option<i64> = session
            .conn
            .exec_first(&session.unlock, (&*key,))
            .await
            .expect("RELEASE_LOCK");
        self.free.lock().unwrap().push(session);
    }
}

/// The raw protocol: insert the key unless there (one statement), then delete it, both
/// prepared once, on one connection shared by the tasks.
struct RawTable {
    conn: tokio::sync::Mutex<(Conn, Statement, Statement)>,
}

impl Subject for RawTable {
    type Guard = Arc<str>;
    async fn lock(&self, key: Arc<str>) -> Arc<str> {
        loop {
            let inserted = {
                let mut guard = self.conn.lock().await;
                let (conn, insert, _) = &mut *guard;
                conn.exec_drop(&*insert, (&*key,))
                    .await
                    .expect("raw insert");
                conn.affected_rows()
            };
            if inserted == 1 {
                return key;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, key: Arc<str>) {
        let mut guard = self.conn.lock().await;
        let (conn, _, delete) = &mut *guard;
        conn.exec_drop(&*delete, (&*key,))
            .await
            .expect("raw delete");
    }
}

fn ratios(w: Workload) -> Vec<Ratio> {
    let (goal, drop_goal) = match w {
        Workload::Lone => (Some(0.9), Some(0.95)),
        Workload::Distinct(_) => (Some(1.0), Some(0.95)),
        Workload::OneKey(..) => (None, None),
    };
    vec![
        ratio("ours", "get_lock", goal),
        ratio("ours-drop", "get_lock", goal),
        ratio("ours-drop", "ours", drop_goal),
        ratio("ours", "raw", None),
    ]
}

/// A connection to the server at `url`.
async fn conn(url: &str) -> Conn {
    Conn::from_url(url).await.expect("connect to mariadb")
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
            "get_lock" => {
                let mut peers = Vec::new();
                for _ in 0..PEER_CONNECTIONS {
                    peers.push(Session::new(conn(&url).await).await);
                }
                let peer = NamedLocks {
                    free: Mutex::new(peers),
                };
                child.run(&Arc::new(peer)).await
            }
            "raw" => {
                let mut conn = conn(&url).await;
                conn.query_drop(
                    "CREATE TABLE IF NOT EXISTS bench_raw \
                     (k VARCHAR(255) PRIMARY KEY) ENGINE=InnoDB",
                )
                .await
                .expect("raw table");
                let insert = conn
                    .prep("INSERT IGNORE INTO bench_raw (k) VALUES (?)")
                    .await
                    .expect("prepare");
                let delete = conn
                    .prep("DELETE FROM bench_raw WHERE k = ?")
                    .await
                    .expect("prepare");
                let raw = RawTable {
                    conn: tokio::sync::Mutex::new((conn, insert, delete)),
                };
                child.run(&Arc::new(raw)).await
            }
            other => panic!("no subject {other}"),
        }
        return;
    }
    let server = MariaDbServer::start().await;
    let bench = Bench {
        backend: "mysql",
        peers: "GET_LOCK + RELEASE_LOCK (a connection per task) and a raw INSERT IGNORE + DELETE, one mariadbd",
        subjects: vec![
            named("ours"),
            named("ours-drop"),
            named("get_lock"),
            named("raw"),
        ],
        target: server.url(),
        servers: server.pid().into_iter().collect(),
        raw: Some("raw"),
        settings: Settings::from_args(),
    };
    let measured = bench.run(&WORKLOADS).await;
    bench.report(&measured, ratios);
}
