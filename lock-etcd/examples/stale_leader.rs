//! Reproduces etcd issue 15247 on the installed `etcd` (no distlock code involved): a
//! leader paused past a lease's TTL revokes, on resuming, a lease that a client kept alive
//! on the new leader all along, and the key on it goes.
//!
//! ```sh
//! cargo run -p lock-etcd --example stale_leader [rounds]
//! ```
//!
//! Each round: a 3-member cluster's leader is paused (SIGSTOP) for 3 s while a lease of
//! 2 s (with a key on it, and 100 idle ones beside it) is renewed through a follower every
//! 300 ms; then the leader resumes and the renewals go on for 2 s more. A round prints
//! whether the key survived. On an affected release some rounds lose it; etcd logs at
//! `info` here, which makes the resumed leader slower to step down and the loss likelier.
//! [`lock_etcd::EtcdBackend::revokes_live_leases_after_a_leader_stall`] tells which
//! releases are affected.

use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseGrantOptions, PutOptions};
use lock_testkit::EtcdCluster;

#[tokio::main]
async fn main() -> Result<(), etcd_client::Error> {
    let rounds: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4);
    let cluster = EtcdCluster::start_with_args(3, &["--log-level", "info"]).await;
    let mut lost = 0;
    for round in 0..rounds {
        let leader = cluster.leader().await;
        let follower = (leader + 1) % cluster.len();
        let mut client = Client::connect([cluster.member(follower).endpoint()], None).await?;
        let base = 1_000_000 * (i64::from(round) + 1);
        let grant = |id| Some(LeaseGrantOptions::new().with_id(id));
        client.lease_client().grant(2, grant(base)).await?;
        let key = format!("stale-leader/{round}");
        client
            .put(key.as_str(), "v", Some(PutOptions::new().with_lease(base)))
            .await?;
        for idle in 1..=100 {
            client.lease_client().grant(2, grant(base + idle)).await?;
        }
        cluster.member(leader).pause();
        let paused = Instant::now();
        let mut resumed = false;
        let mut renewed = 0;
        while paused.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if !resumed && paused.elapsed() >= Duration::from_secs(3) {
                cluster.member(leader).resume();
                resumed = true;
            }
            let mut leases = client.lease_client();
            let renewal = leases.keep_alive(base);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), renewal).await {
                renewed += 1;
            }
        }
        cluster.member(leader).resume();
        let survived = !client.get(key.as_str(), None).await?.kvs().is_empty();
        lost += u32::from(!survived);
        println!(
            "round {round}: leader {leader} paused 3 s; lease renewed {renewed} times; \
             key {}",
            if survived {
                "kept"
            } else {
                "LOST (revoked by the resumed leader)"
            }
        );
    }
    println!("{lost} of {rounds} rounds lost a lease that was kept alive");
    Ok(())
}
