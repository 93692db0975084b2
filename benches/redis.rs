//! Redis backend against its peers on one `redis-server` started by lock-testkit, in the
//! same run: rslock 0.10 (a Redlock client, here over one node) and the raw protocol
//! (`SET NX PX` then `DEL` with redis-rs: two round trips, no scripts, no policy), on the
//! workloads of every bench (see `common`), distlock's guards ended by `release().await`
//! and by drop.

mod common;
#[path = "common/fenced.rs"]
mod fenced;
#[path = "common/rslock.rs"]
mod rslock_peer;

use std::sync::Arc;
use std::time::Duration;

use common::{
    named, ratio, Bench, Child, Distlock, End, Ratio, Settings, Subject, Workload, WORKLOADS,
};
use fenced::RawFenced;
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
            "raw-fenced" => child.run(&RawFenced::connect(&[url]).await).await,
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
