//! The bound of fenced server work, shared by the redis and redlock benches: distlock's own
//! grant and release scripts ([`lock_redis::lock_scripts`]) called in a plain loop with
//! redis-rs (`EVALSHA`, fencing and release notices as distlock does them, a fresh owner
//! token per grant) on every node at once, with no Locker, guard, queue, group commit or
//! quorum logic around them (on several nodes, no write-back of differing fences either):
//! what the server work of a fenced lock costs, against which the library's overhead and
//! rslock's unfenced pair are read.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::common::{rand_u128, Subject};

/// The scripts on connections to every node.
pub struct RawFenced {
    conns: Vec<MultiplexedConnection>,
    acquire: redis::Script,
    release: redis::Script,
}

impl RawFenced {
    /// Connects to every node at `urls`.
    pub async fn connect(urls: &[String]) -> Arc<Self> {
        let mut conns = Vec::new();
        for url in urls {
            conns.push(
                redis::Client::open(url.as_str())
                    .expect("a Redis URL")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("raw connect"),
            );
        }
        let (acquire, release) = lock_redis::lock_scripts();
        Arc::new(RawFenced {
            conns,
            acquire: redis::Script::new(acquire),
            release: redis::Script::new(release),
        })
    }

    fn keys(key: &str, owner: &str) -> [String; 4] {
        let lock = format!("fenced:{{{key}}}");
        [
            lock.clone(),
            format!("{lock}:fence"),
            format!("{lock}:x:{owner}"),
            format!("{lock}:holders"),
        ]
    }

    /// Runs the release script on the nodes `on` says.
    async fn release_on(&self, key: &str, owner: &str, on: impl Fn(usize) -> bool) {
        let keys = Self::keys(key, owner);
        let calls = self
            .conns
            .iter()
            .enumerate()
            .filter(|(i, _)| on(*i))
            .map(|(_, c)| {
                let mut c = c.clone();
                let mut call = self.release.key(&keys[0]);
                call.arg("fenced:released").arg(owner).arg(key);
                async move {
                    let _: Vec<redis::Value> =
                        call.invoke_async(&mut c).await.expect("raw fenced release");
                }
            });
        futures::future::join_all(calls).await;
    }
}

impl Subject for RawFenced {
    type Guard = (Arc<str>, String);
    async fn lock(&self, key: Arc<str>) -> (Arc<str>, String) {
        let owner = format!("{:032x}", rand_u128());
        let keys = Self::keys(&key, &owner);
        loop {
            let calls = self.conns.iter().map(|c| {
                let mut c = c.clone();
                let mut call = self.acquire.key(&keys[0]);
                call.key(&keys[1])
                    .key(&keys[2])
                    .key(&keys[3])
                    .arg(&owner)
                    .arg(30_000)
                    .arg(630_000);
                async move {
                    let reply: Vec<redis::Value> =
                        call.invoke_async(&mut c).await.expect("raw fenced acquire");
                    reply.first() == Some(&redis::Value::Int(1))
                }
            });
            let granted = futures::future::join_all(calls).await;
            if granted.iter().all(|g| *g) {
                return (key, owner);
            }
            // Give back the nodes this attempt took, then try again.
            self.release_on(&key, &owner, |i| granted[i]).await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, (key, owner): (Arc<str>, String)) {
        self.release_on(&key, &owner, |_| true).await;
    }
}
