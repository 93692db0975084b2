//! Raw baseline

use super::*;

/// The raw baseline (put + delete) never touches a lock: raw cycles on a held lock's name
/// write only `<prefix minus its last character>.baseline/<name>`, outside the lock prefix
/// (so the release watch never sees them), leave the holder and its fence as they were,
/// and leave no key behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_baseline_leaves_locks_alone_and_nothing_behind() {
    use etcd_client::{EventType, GetOptions, WatchOptions};
    let server = EtcdServer::start().await;
    let b = Arc::new(backend(&[server.endpoint()], "prefix=raw/").await);
    let locker = Locker::with_backend(b.clone());
    let raw = b.baseline().expect("etcd has a raw baseline");
    assert_eq!(raw.description(), distlock::etcd::BASELINE_CYCLE);
    let ttl = b
        .capabilities()
        .effective_ttl(Duration::from_secs(5))
        .unwrap();
    let k = key("raw");
    let guard = locker
        .acquire(&k, &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    let held = b.inspect(&k).await.unwrap().pop().expect("held");

    // Every event in the store from now on.
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let mut stream = created_watch(&mut client, "", WatchOptions::new().with_all_keys()).await;
    const CYCLES: usize = 5;
    for _ in 0..CYCLES {
        raw.raw_cycle(&k, ttl).await.unwrap();
    }
    let raw_key = format!("raw.baseline/{k}");
    let mut events = Vec::new();
    while events.len() < 2 * CYCLES {
        let response = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("the raw cycles' events")
            .unwrap()
            .expect("an open watch");
        for event in response.events() {
            let key = event.kv().map(|kv| kv.key_str().unwrap().to_owned());
            events.push((event.event_type(), key.unwrap_or_default()));
        }
    }
    for (i, (kind, key)) in events.iter().enumerate() {
        let expected = if i % 2 == 0 {
            EventType::Put
        } else {
            EventType::Delete
        };
        assert_eq!(
            (*kind, key.as_str()),
            (expected, raw_key.as_str()),
            "{events:?}"
        );
    }

    let after = b.inspect(&k).await.unwrap().pop().expect("still held");
    assert_eq!(after.owner, held.owner);
    assert_eq!(after.fence, held.fence);
    assert!(!guard.is_lost());
    let keys = |mut client: etcd_client::Client| async move {
        let all = client
            .get("", Some(GetOptions::new().with_all_keys().with_keys_only()))
            .await
            .unwrap();
        let keys: Vec<String> = all
            .kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap().to_owned())
            .collect();
        keys
    };
    assert_eq!(keys(client.clone()).await, [format!("raw/{k}")]);
    guard.release().await.unwrap();
    assert!(keys(client.clone()).await.is_empty());
}
