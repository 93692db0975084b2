//! etcd backend against its peers on one etcd started by lock-testkit, in the same run:
//! etcd's own lock RPC (etcd-client's `lock`/`unlock`, each lock on a lease of its own
//! taken from a free list, as a worker with one session would) and the raw protocol (a
//! put-if-absent transaction then a delete: two round trips, no lease, no policy), on the
//! workloads of every bench (see `common`), distlock's guards ended by `release().await`
//! and by drop.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    named, ratio, Bench, Child, Distlock, End, Ratio, Settings, Subject, Workload, WORKLOADS,
};
use etcd_client::{Client, Compare, CompareOp, LockOptions, Txn, TxnOp};
use lock_testkit::EtcdServer;

/// TTL of the peer's leases: longer than the whole run, so nobody needs to renew them.
const PEER_LEASE_SECS: i64 = 3600;

/// etcd's lock RPC. A waiter's lock key is named after its lease, so two waiters sharing a
/// lease would both "hold" the lock: each lock call takes a lease of its own from a free
/// list (granting one when empty) and gives it back on unlock.
struct LockRpc {
    client: Client,
    leases: Mutex<Vec<i64>>,
}

impl LockRpc {
    async fn lease(&self) -> i64 {
        let free = self.leases.lock().unwrap().pop();
        match free {
            Some(id) => id,
            None => self
                .client
                .clone()
                .lease_grant(PEER_LEASE_SECS, None)
                .await
                .expect("peer lease grant")
                .id(),
        }
    }
}

impl Subject for LockRpc {
    type Guard = (Vec<u8>, i64);
    async fn lock(&self, key: Arc<str>) -> (Vec<u8>, i64) {
        let lease = self.lease().await;
        let held = self
            .client
            .clone()
            .lock(key.as_bytes(), Some(LockOptions::new().with_lease(lease)))
            .await
            .expect("lock RPC");
        (held.key().to_vec(), lease)
    }
    async fn unlock(&self, (key, lease): (Vec<u8>, i64)) {
        self.client.clone().unlock(key).await.expect("unlock RPC");
        self.leases.lock().unwrap().push(lease);
    }
}

/// The raw protocol: put the key if absent (one transaction), then delete it.
struct RawTxn {
    client: Client,
}

impl Subject for RawTxn {
    type Guard = String;
    async fn lock(&self, key: Arc<str>) -> String {
        let key = format!("raw/{key}");
        loop {
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.as_str(), "token", None)]);
            let put = self.client.clone().txn(txn).await.expect("raw txn");
            if put.succeeded() {
                return key;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, key: String) {
        self.client
            .clone()
            .delete(key, None)
            .await
            .expect("raw delete");
    }
}

fn ratios(w: Workload) -> Vec<Ratio> {
    let (goal, drop_goal) = match w {
        Workload::Lone => (Some(1.0), Some(0.95)),
        Workload::Distinct(_) => (Some(2.5), Some(0.95)),
        Workload::OneKey(..) => (None, None),
    };
    vec![
        ratio("ours", "lock-rpc", goal),
        ratio("ours-drop", "lock-rpc", goal),
        ratio("ours-drop", "ours", drop_goal),
        ratio("ours", "raw", None),
    ]
}

#[tokio::main]
async fn main() {
    if let Some(child) = Child::from_env() {
        // The target is the endpoint; distlock's subjects get it as a URL.
        let endpoint = child.target().to_owned();
        let url = format!("etcd://{endpoint}");
        let connect = || async {
            Client::connect([endpoint.as_str()], None)
                .await
                .expect("peer connect")
        };
        match child.subject() {
            "ours" => {
                child
                    .run(&Distlock::connect(&url, End::Release).await)
                    .await
            }
            "ours-drop" => child.run(&Distlock::connect(&url, End::Drop).await).await,
            "lock-rpc" => {
                let peer = LockRpc {
                    client: connect().await,
                    leases: Mutex::default(),
                };
                child.run(&Arc::new(peer)).await
            }
            "raw" => {
                let raw = RawTxn {
                    client: connect().await,
                };
                child.run(&Arc::new(raw)).await
            }
            other => panic!("no subject {other}"),
        }
        return;
    }
    let server = EtcdServer::start().await;
    let bench = Bench {
        backend: "etcd",
        peers: "etcd's lock RPC and a raw put-if-absent txn + delete, one etcd",
        subjects: vec![
            named("ours"),
            named("ours-drop"),
            named("lock-rpc"),
            named("raw"),
        ],
        target: server.endpoint().to_string(),
        servers: server.pid().into_iter().collect(),
        raw: Some("raw"),
        settings: Settings::from_args(),
    };
    let measured = bench.run(&WORKLOADS).await;
    bench.report(&measured, ratios);
}
