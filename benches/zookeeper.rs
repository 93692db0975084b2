//! ZooKeeper backend against the raw Curator-style recipe on one three-member ensemble
//! started by lock-testkit, in the same run: create an ephemeral sequential node under the
//! key's node, list the children, hold when the node is the lowest (otherwise watch the
//! node before it and list again when it goes), delete it to release; with
//! zookeeper-client and no library around it, one session shared by the tasks. On the
//! workloads of every bench (see `common`), distlock's guards ended by `release().await`
//! and by drop. Server CPU is the three members' JVMs.

mod common;

use std::sync::Arc;

use common::{
    named, ratio, Bench, Child, Distlock, End, Ratio, Settings, Subject, Workload, WORKLOADS,
};
use lock_testkit::ZooKeeperEnsemble;
use zookeeper_client as zk;

/// Where the raw recipe keeps its keys' nodes.
const RAW_ROOT: &str = "/bench-raw";

/// Curator's `InterProcessMutex` written by hand: one session, a node per acquisition.
struct RawRecipe {
    client: zk::Client,
}

fn options(mode: zk::CreateMode) -> zk::CreateOptions<'static> {
    mode.with_acls(zk::Acls::anyone_all())
}

impl Subject for RawRecipe {
    type Guard = String;
    async fn lock(&self, key: Arc<str>) -> String {
        let dir = format!("{RAW_ROOT}/{key}");
        let prefix = format!("{dir}/lock-");
        let (_, sequence) = match self
            .client
            .create(&prefix, &[], &options(zk::CreateMode::EphemeralSequential))
            .await
        {
            Ok(created) => created,
            Err(zk::Error::NoNode) => {
                self.client
                    .mkdir(&dir, &options(zk::CreateMode::Persistent))
                    .await
                    .expect("mkdir");
                self.client
                    .create(&prefix, &[], &options(zk::CreateMode::EphemeralSequential))
                    .await
                    .expect("create")
            }
            Err(e) => panic!("create: {e}"),
        };
        let name = format!("lock-{sequence}");
        loop {
            let mut children = self.client.list_children(&dir).await.expect("list");
            children.sort();
            let place = children.iter().position(|c| *c == name).expect("our node");
            if place == 0 {
                return format!("{dir}/{name}");
            }
            let before = format!("{dir}/{}", children[place - 1]);
            let (stat, watcher) = self
                .client
                .check_and_watch_stat(&before)
                .await
                .expect("watch");
            if stat.is_some() {
                watcher.changed().await;
            }
        }
    }
    async fn unlock(&self, path: String) {
        self.client.delete(&path, None).await.expect("delete");
    }
}

fn ratios(w: Workload) -> Vec<Ratio> {
    let drop_goal = match w {
        Workload::Lone | Workload::Distinct(_) => Some(0.95),
        Workload::OneKey(..) => None,
    };
    vec![
        ratio("ours", "raw", None),
        ratio("ours-drop", "raw", None),
        ratio("ours-drop", "ours", drop_goal),
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
            "raw" => {
                let hosts = url.trim_start_matches("zookeeper://").to_owned();
                let client = zk::Client::connector()
                    .with_session_timeout(std::time::Duration::from_secs(30))
                    .connect(&hosts)
                    .await
                    .expect("connect to the ensemble");
                child.run(&Arc::new(RawRecipe { client })).await
            }
            other => panic!("no subject {other}"),
        }
        return;
    }
    let ensemble = ZooKeeperEnsemble::start().await;
    let bench = Bench {
        backend: "zookeeper",
        peers: "the raw Curator recipe (create EPHEMERAL_SEQUENTIAL + getChildren + delete, a watch on the predecessor), one session, three members",
        subjects: vec![named("ours"), named("ours-drop"), named("raw")],
        target: ensemble.url(""),
        servers: (0..ensemble.len()).filter_map(|i| ensemble.pid(i)).collect(),
        raw: Some("raw"),
        settings: Settings::from_args(),
    };
    let measured = bench.run(&WORKLOADS).await;
    bench.report(&measured, ratios);
}
