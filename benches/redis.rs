//! Redis backend against its peers on one `redis-server` started by lock-testkit, in the
//! same run: rslock 0.10 (a Redlock client, here over one node) and the raw protocol
//! (`SET NX PX` then `DEL` with redis-rs: two round trips, no scripts, no policy), on the
//! workloads of every bench (see `common`), distlock's guards ended by `release().await`
//! and by drop.

mod common;
#[path = "common/rslock.rs"]
mod rslock_peer;

use std::sync::Arc;
use std::time::Duration;

use common::{
    named, ratio, Bench, Child, Distlock, End, Ratio, Settings, Subject, Workload, WORKLOADS,
};
use lock_testkit::RedisServer;
use redis::aio::MultiplexedConnection;
use rslock_peer::Rslock;

/// The raw protocol: `SET key token NX PX ttl`, then `DEL key` (no owner check on release,
/// no fencing, no notices): what two round trips on one multiplexed connection cost.
struct RawProtocol {
    conn: MultiplexedConnection,
}

impl Subject for RawProtocol {
    type Guard = Arc<str>;
    async fn lock(&self, key: Arc<str>) -> Arc<str> {
        let mut conn = self.conn.clone();
        loop {
            let set: Option<String> = redis::cmd("SET")
                .arg(format!("raw:{key}"))
                .arg("token")
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut conn)
                .await
                .expect("raw SET");
            if set.is_some() {
                return key;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, key: Arc<str>) {
        let mut conn = self.conn.clone();
        let _: i64 = redis::cmd("DEL")
            .arg(format!("raw:{key}"))
            .query_async(&mut conn)
            .await
            .expect("raw DEL");
    }
}

/// The bound of the fenced protocol: distlock's own grant and release scripts
/// ([`lock_redis::lock_scripts`]) called in a plain loop with redis-rs (`EVALSHA`, fencing
/// and release notices as distlock does them, a fresh owner token per grant), with no
/// Locker, guard, queue or group commit around them: what the server work of a fenced lock
/// costs, against which the library's own overhead and rslock's unfenced pair are read.
struct RawFenced {
    conn: MultiplexedConnection,
    acquire: redis::Script,
    release: redis::Script,
}

impl RawFenced {
    fn keys(key: &str, owner: &str) -> [String; 4] {
        let lock = format!("fenced:{{{key}}}");
        [
            lock.clone(),
            format!("{lock}:fence"),
            format!("{lock}:x:{owner}"),
            format!("{lock}:holders"),
        ]
    }
}

impl Subject for RawFenced {
    type Guard = (Arc<str>, String);
    async fn lock(&self, key: Arc<str>) -> (Arc<str>, String) {
        let mut conn = self.conn.clone();
        let owner = format!("{:032x}", common::rand_u128());
        let keys = Self::keys(&key, &owner);
        loop {
            let reply: Vec<redis::Value> = self
                .acquire
                .key(&keys[0])
                .key(&keys[1])
                .key(&keys[2])
                .key(&keys[3])
                .arg(&owner)
                .arg(30_000)
                .arg(630_000)
                .invoke_async(&mut conn)
                .await
                .expect("raw fenced acquire");
            if reply.first() == Some(&redis::Value::Int(1)) {
                return (key, owner);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, (key, owner): (Arc<str>, String)) {
        let mut conn = self.conn.clone();
        let keys = Self::keys(&key, &owner);
        let _: Vec<redis::Value> = self
            .release
            .key(&keys[0])
            .arg("fenced:released")
            .arg(&owner)
            .arg(&*key)
            .invoke_async(&mut conn)
            .await
            .expect("raw fenced release");
    }
}

fn ratios(w: Workload) -> Vec<Ratio> {
    let (goal, drop_goal) = match w {
        Workload::Lone => (Some(1.0), Some(0.95)),
        Workload::Distinct(_) => (Some(1.1), Some(0.95)),
        Workload::OneKey(..) => (None, None),
    };
    vec![
        ratio("ours", "rslock", goal),
        ratio("ours-drop", "rslock", goal),
        ratio("ours-drop", "ours", drop_goal),
        ratio("ours", "raw", None),
        ratio("raw-fenced", "rslock", None),
        ratio("ours", "raw-fenced", None),
    ]
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
            "rslock" => child.run(&Rslock::new(vec![url])).await,
            "raw" => {
                let conn = redis::Client::open(url)
                    .expect("a Redis URL")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("raw connect");
                child.run(&Arc::new(RawProtocol { conn })).await
            }
            "raw-fenced" => {
                let conn = redis::Client::open(url)
                    .expect("a Redis URL")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("raw connect");
                let (acquire, release) = lock_redis::lock_scripts();
                let raw = RawFenced {
                    conn,
                    acquire: redis::Script::new(acquire),
                    release: redis::Script::new(release),
                };
                child.run(&Arc::new(raw)).await
            }
            other => panic!("no subject {other}"),
        }
        return;
    }
    let server = RedisServer::start().await;
    let bench = Bench {
        backend: "redis",
        peers: "rslock 0.10, raw SET NX PX + DEL, and raw-fenced (distlock's scripts in a plain loop), one redis-server",
        subjects: vec![
            named("ours"),
            named("ours-drop"),
            named("rslock"),
            named("raw"),
            named("raw-fenced"),
        ],
        target: server.url(),
        servers: server.pid().into_iter().collect(),
        raw: Some("raw"),
        settings: Settings::from_args(),
    };
    let measured = bench.run(&WORKLOADS).await;
    bench.report(&measured, ratios);
}
