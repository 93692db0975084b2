//! Semaphores: 16 tasks sharing the 4 permits of one key, each taking one permit per cycle,
//! on the in-process backend and on one `redis-server` started by lock-testkit, against the
//! peer with no library around it in the same run:
//!
//! - memory: a `HashMap` of `tokio::sync::Semaphore` (4 permits each), `acquire_owned(1)`;
//! - Redis: the raw protocol of an expiring semaphore, a sorted set of holders scored by
//!   their expiry: one script `ZREMRANGEBYSCORE key -inf now` + `ZCARD` + `ZADD` (retried
//!   every millisecond while full), then `ZREM` (no fencing, no owner check beyond the
//!   member, no notices, no queue);
//! - PostgreSQL: the same in SQL, one simple-query transaction per acquisition (the key's
//!   transaction advisory lock, delete the expired holders, insert a holder row when fewer
//!   than 4 live ones are there; retried every millisecond while full), then a `DELETE` of
//!   the row; a logged table, as distlock's holder table is.
//!
//! distlock's subjects use `locker.acquire(key, &opts.permits(Permits::new(1, 4)))` with the
//! Locker's default options otherwise (watchdog on), ended by `release().await` (`ours`) or
//! by drop (`ours-drop`). Then, per backend, one task of each kind of grant (`lock`, `ours`:
//! 1 of 4 permits, `reader`, `writer`) against the lock's cycle (`<backend>-kinds`): each
//! kind is to be within 1.2× of a lock. Like every bench, each subject runs each round in its own process
//! (see `common`).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{named, ratio, Bench, Child, Distlock, End, Ratio, Settings, Subject, Workload};
use distlock::Permits;
use lock_testkit::{PostgresServer, RedisServer};
use redis::aio::MultiplexedConnection;

/// Permits on the key.
const PERMITS: u32 = 4;

/// More tasks than permits: back to back (the cost of a grant under contention) and
/// holding 1 ms (how well the permits are kept busy).
const WORKLOADS: [Workload; 2] = [
    Workload::OneKey(16, Duration::ZERO),
    Workload::OneKey(16, Duration::from_millis(1)),
];

/// distlock taking one of [`PERMITS`] permits per grant.
async fn ours(url: &str, end: End) -> Arc<Distlock> {
    claiming(url, end, Permits::new(1, PERMITS).expect("1 of 4")).await
}

/// distlock claiming `permits` per grant (a lock, a semaphore's permit, a reader or a
/// writer).
async fn claiming(url: &str, end: End, permits: Permits) -> Arc<Distlock> {
    let subject = Arc::into_inner(Distlock::connect(url, end).await).expect("fresh");
    let opts = subject.locker.default_options().clone().permits(permits);
    Arc::new(Distlock {
        opts: Some(opts),
        ..subject
    })
}

/// The in-process peer: one `tokio::sync::Semaphore` per key.
#[derive(Default)]
struct SemaphoreMap {
    map: Mutex<HashMap<Arc<str>, Arc<tokio::sync::Semaphore>>>,
}

impl Subject for SemaphoreMap {
    type Guard = tokio::sync::OwnedSemaphorePermit;
    async fn lock(&self, key: Arc<str>) -> Self::Guard {
        let sem = self
            .map
            .lock()
            .unwrap()
            .entry(key)
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(PERMITS as usize)))
            .clone();
        sem.acquire_owned().await.expect("never closed")
    }
    async fn unlock(&self, permit: Self::Guard) {
        drop(permit);
    }
}

/// Takes a permit when fewer than `ARGV[3]` unexpired holders are in the set.
const RAW_ACQUIRE: &str = r"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
  return 1
end
return 0
";

/// The raw Redis semaphore (see the module's documentation).
struct RawSemaphore {
    conn: MultiplexedConnection,
    acquire: redis::Script,
}

impl Subject for RawSemaphore {
    type Guard = (Arc<str>, String);
    async fn lock(&self, key: Arc<str>) -> Self::Guard {
        let mut conn = self.conn.clone();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let member = format!("{}:{}", std::process::id(), NEXT.fetch_add(1, Relaxed));
        loop {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("after 1970")
                .as_millis() as u64;
            let got: i64 = self
                .acquire
                .key(format!("raw:{key}"))
                .arg(now)
                .arg(now + 30_000)
                .arg(PERMITS)
                .arg(&member)
                .invoke_async(&mut conn)
                .await
                .expect("raw acquire");
            if got == 1 {
                return (key, member);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, (key, member): Self::Guard) {
        let mut conn = self.conn.clone();
        let _: i64 = redis::cmd("ZREM")
            .arg(format!("raw:{key}"))
            .arg(member)
            .query_async(&mut conn)
            .await
            .expect("raw ZREM");
    }
}

/// The raw PostgreSQL semaphore (see the module's documentation).
struct RawSql {
    client: tokio_postgres::Client,
    release: tokio_postgres::Statement,
}

impl Subject for RawSql {
    type Guard = String;
    async fn lock(&self, key: Arc<str>) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let owner = format!("{}:{}", std::process::id(), NEXT.fetch_add(1, Relaxed));
        // Bench keys are hex digits and slashes, owners digits and a colon: nothing to quote.
        let acquire = format!(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtext('{key}')); \
             DELETE FROM bench_sem WHERE key = '{key}' AND expires_at < now(); \
             INSERT INTO bench_sem (key, owner, expires_at) \
               SELECT '{key}', '{owner}', now() + interval '30 s' \
               WHERE (SELECT count(*) FROM bench_sem WHERE key = '{key}') < {PERMITS} \
               RETURNING 1; COMMIT"
        );
        loop {
            let messages = self
                .client
                .simple_query(&acquire)
                .await
                .expect("raw acquire");
            let granted = messages
                .iter()
                .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)));
            if granted {
                return owner;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, owner: String) {
        self.client
            .execute(&self.release, &[&owner])
            .await
            .expect("raw release");
    }
}

async fn raw_sql(url: &str) -> Arc<RawSql> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to postgres");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS bench_sem \
             (key text, owner text, expires_at timestamptz, PRIMARY KEY (key, owner))",
        )
        .await
        .expect("raw table");
    let release = client
        .prepare("DELETE FROM bench_sem WHERE owner = $1")
        .await
        .expect("prepare");
    Arc::new(RawSql { client, release })
}

/// Each kind of grant against a lock's cycle on the same backend, one task: a semaphore's
/// permit, a reader and a writer are each to be within 1.2× of a lock (a ratio of at
/// least 1 / 1.2).
fn kinds(_: Workload) -> Vec<Ratio> {
    let goal = Some(1.0 / 1.2);
    vec![
        ratio("ours", "lock", goal),
        ratio("reader", "lock", goal),
        ratio("writer", "lock", goal),
    ]
}

/// The kinds' bench of the backend at `target`: a lock, 1 of 4 permits, a reader and a
/// writer, one task each, released with `release().await`.
async fn run_kinds(backend: &'static str, target: String, servers: Vec<u32>, settings: Settings) {
    let bench = Bench {
        backend,
        peers:
            "a lock on the same backend (the semaphore's permit, a reader and a writer, one task)",
        subjects: vec![
            named("lock"),
            named("ours"),
            named("reader"),
            named("writer"),
        ],
        target,
        servers,
        raw: None,
        settings,
    };
    let measured = bench.run(&[Workload::Lone]).await;
    bench.report(&measured, kinds);
}

fn ratios(peer: &'static str) -> impl Fn(Workload) -> Vec<Ratio> {
    move |_| {
        vec![
            ratio("ours", peer, None),
            ratio("ours-drop", peer, None),
            ratio("ours-drop", "ours", None),
        ]
    }
}

#[tokio::main]
async fn main() {
    if let Some(child) = Child::from_env() {
        let url = child.target().to_owned();
        match (url.split(':').next().unwrap_or(""), child.subject()) {
            (_, "ours") => child.run(&ours(&url, End::Release).await).await,
            (_, "ours-drop") => child.run(&ours(&url, End::Drop).await).await,
            (_, "lock") => {
                child
                    .run(&Distlock::connect(&url, End::Release).await)
                    .await
            }
            (_, "reader") => {
                child
                    .run(&claiming(&url, End::Release, Permits::read()).await)
                    .await
            }
            (_, "writer") => {
                child
                    .run(&claiming(&url, End::Release, Permits::write()).await)
                    .await
            }
            ("memory", "semaphore-map") => child.run(&Arc::new(SemaphoreMap::default())).await,
            ("postgres", "raw") => child.run(&raw_sql(&url).await).await,
            ("redis", "raw") => {
                let conn = redis::Client::open(url)
                    .expect("a Redis URL")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("raw connect");
                let acquire = redis::Script::new(RAW_ACQUIRE);
                child.run(&Arc::new(RawSemaphore { conn, acquire })).await
            }
            (_, other) => panic!("no subject {other}"),
        }
        return;
    }
    let settings = Settings::from_args();
    let memory = Bench {
        backend: "memory-permits",
        peers: "a HashMap of tokio::sync::Semaphore, 1 of 4 permits per grant",
        subjects: vec![named("ours"), named("ours-drop"), named("semaphore-map")],
        target: "memory://".to_owned(),
        servers: Vec::new(),
        raw: None,
        settings,
    };
    let measured = memory.run(&WORKLOADS).await;
    memory.report(&measured, ratios("semaphore-map"));
    run_kinds("memory-kinds", "memory://".to_owned(), Vec::new(), settings).await;

    let server = RedisServer::start().await;
    let redis = Bench {
        backend: "redis-permits",
        peers:
            "a raw sorted-set semaphore script + ZREM, 1 of 4 permits per grant, one redis-server",
        subjects: vec![named("ours"), named("ours-drop"), named("raw")],
        target: server.url(),
        servers: server.pid().into_iter().collect(),
        raw: None,
        settings,
    };
    let measured = redis.run(&WORKLOADS).await;
    redis.report(&measured, ratios("raw"));
    let servers = server.pid().into_iter().collect();
    run_kinds("redis-kinds", server.url(), servers, settings).await;
    drop(server);

    let server = PostgresServer::start().await;
    let postgres = Bench {
        backend: "postgres-permits",
        peers: "a raw SQL semaphore (advisory-locked insert-if-fewer + delete), 1 of 4 permits per grant, one postgres",
        subjects: vec![named("ours"), named("ours-drop"), named("raw")],
        target: server.url(),
        servers: server.pid().into_iter().collect(),
        raw: None,
        settings,
    };
    let measured = postgres.run(&WORKLOADS).await;
    postgres.report(&measured, ratios("raw"));
    let servers = server.pid().into_iter().collect();
    run_kinds("postgres-kinds", server.url(), servers, settings).await;
}
