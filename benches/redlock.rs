//! Redlock backend (3 nodes, fencing on as `redlock://` has it) against its peers on the
//! same three `redis-server` processes, in the same run: rslock 0.10 and the raw protocol
//! (`SET NX PX` then `DEL` on every node in parallel, no quorum logic, no scripts), on the
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
use lock_testkit::RedisNodes;
use redis::aio::MultiplexedConnection;
use rslock_peer::Rslock;

/// The raw protocol on every node at once: what one parallel round trip per step costs.
struct RawFanOut {
    conns: Vec<MultiplexedConnection>,
}

impl RawFanOut {
    async fn each(&self, cmd: &redis::Cmd) -> Vec<redis::Value> {
        let calls = self.conns.iter().map(|c| {
            let mut c = c.clone();
            async move { cmd.query_async::<redis::Value>(&mut c).await.expect("raw") }
        });
        futures::future::join_all(calls).await
    }
}

impl Subject for RawFanOut {
    type Guard = Arc<str>;
    async fn lock(&self, key: Arc<str>) -> Arc<str> {
        let mut set = redis::cmd("SET");
        set.arg(format!("raw:{key}"))
            .arg("token")
            .arg("NX")
            .arg("PX")
            .arg(30_000);
        let mut del = redis::cmd("DEL");
        del.arg(format!("raw:{key}"));
        loop {
            let answers = self.each(&set).await;
            let granted: Vec<bool> = answers
                .iter()
                .map(|v| !matches!(v, redis::Value::Nil))
                .collect();
            if granted.iter().all(|g| *g) {
                return key;
            }
            // Give back the nodes this attempt took (they are ours), then try again.
            let undo = self
                .conns
                .iter()
                .zip(&granted)
                .filter(|(_, g)| **g)
                .map(|(c, _)| {
                    let mut c = c.clone();
                    let del = del.clone();
                    async move { del.query_async::<redis::Value>(&mut c).await.expect("raw") }
                });
            futures::future::join_all(undo).await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, key: Arc<str>) {
        let mut del = redis::cmd("DEL");
        del.arg(format!("raw:{key}"));
        self.each(&del).await;
    }
}

fn ratios(w: Workload) -> Vec<Ratio> {
    let (goal, drop_goal) = match w {
        Workload::Lone => (Some(1.0), Some(0.95)),
        Workload::Distinct(_) => (Some(1.2), Some(0.95)),
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
        // The target is the nodes' addresses, comma-separated.
        let hosts: Vec<String> = child.target().split(',').map(str::to_owned).collect();
        let url = format!("redlock://{}", hosts.join(","));
        let urls: Vec<String> = hosts.iter().map(|h| format!("redis://{h}")).collect();
        match child.subject() {
            "ours" => {
                child
                    .run(&Distlock::connect(&url, End::Release).await)
                    .await
            }
            "ours-drop" => child.run(&Distlock::connect(&url, End::Drop).await).await,
            "rslock" => child.run(&Rslock::new(urls.clone())).await,
            "raw-fenced" => child.run(&RawFenced::connect(&urls).await).await,
            "raw" => {
                let mut conns = Vec::new();
                for url in urls {
                    conns.push(
                        redis::Client::open(url)
                            .expect("a Redis URL")
                            .get_multiplexed_async_connection()
                            .await
                            .expect("raw connect"),
                    );
                }
                child.run(&Arc::new(RawFanOut { conns })).await
            }
            other => panic!("no subject {other}"),
        }
        return;
    }
    let nodes = RedisNodes::start(3).await;
    let hosts: Vec<String> = nodes.addrs().iter().map(|a| a.to_string()).collect();
    let bench = Bench {
        backend: "redlock",
        peers: "rslock 0.10, raw SET NX PX + DEL and raw-fenced (distlock's scripts in a plain loop) on all nodes, 3 redis-server",
        subjects: vec![
            named("ours"),
            named("ours-drop"),
            named("rslock"),
            named("raw"),
            named("raw-fenced"),
        ],
        target: hosts.join(","),
        servers: nodes.nodes().iter().filter_map(|n| n.pid()).collect(),
        raw: Some("raw"),
        settings: Settings::from_args(),
    };
    let measured = bench.run(&WORKLOADS).await;
    bench.report(&measured, ratios);
}
