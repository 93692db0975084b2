//! Semaphores: 16 tasks sharing the 4 permits of one key, each taking one permit per cycle,
//! on the in-process backend and on one `redis-server` started by lock-testkit, against the
//! peer with no library around it in the same run:
//!
//! - memory: a `HashMap` of `tokio::sync::Semaphore` (4 permits each), `acquire_owned(1)`;
//! - Redis: the raw protocol of an expiring semaphore, a sorted set of holders scored by
//!   their expiry: one script `ZREMRANGEBYSCORE key -inf now` + `ZCARD` + `ZADD` (retried
//!   every millisecond while full), then `ZREM` (no fencing, no owner check beyond the
//!   member, no notices, no queue).
//!
//! distlock's subjects use `locker.acquire(key, &opts.permits(Permits::new(1, 4)))` with the
//! Locker's default options otherwise (watchdog on), ended by `release().await` (`ours`) or
//! by drop (`ours-drop`). Like every bench, each subject runs each round in its own process
//! (see `common`).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{named, ratio, Bench, Child, Distlock, End, Ratio, Settings, Subject, Workload};
use distlock::Permits;
use lock_testkit::RedisServer;
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
    let subject = Arc::into_inner(Distlock::connect(url, end).await).expect("fresh");
    let permits = Permits::new(1, PERMITS).expect("1 of 4");
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
        match (url.starts_with("memory:"), child.subject()) {
            (_, "ours") => child.run(&ours(&url, End::Release).await).await,
            (_, "ours-drop") => child.run(&ours(&url, End::Drop).await).await,
            (true, "semaphore-map") => child.run(&Arc::new(SemaphoreMap::default())).await,
            (false, "raw") => {
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
}
