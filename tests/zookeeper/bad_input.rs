//! Bad input

use super::*;

/// Nothing listens: connecting fails with a transient `Unavailable` within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_ensemble_is_unavailable_within_the_timeout() {
    // Nothing listens there, and nothing else can be given them while they live.
    let closed = [lock_testkit::closed_port(), lock_testkit::closed_port()];
    let (p1, p2) = (closed[0].port(), closed[1].port());
    let url = format!("zookeeper://127.0.0.1:{p1},127.0.0.1:{p2}?timeout=500ms");
    let started = Instant::now();
    let err = distlock::connect(&url).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(500) + common::SLACK,
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_transient());
}

/// Malformed URLs are refused before any I/O with `InvalidUrl` saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_urls_are_refused() {
    for (url, says) in [
        ("zookeeper://", "host"),
        ("zookeeper://u:p@127.0.0.1:1", "user"),
        ("zookeeper://127.0.0.1:1?table=x", "table"),
        ("zookeeper://127.0.0.1:1?timeout=0s", "timeout"),
        (
            "zookeeper://127.0.0.1:1?session_timeout=soon",
            "session_timeout",
        ),
        ("zookeeper://127.0.0.1:1/a//b", "root"),
        ("zookeeper://127.0.0.1:1/zookeeper", "zookeeper"),
    ] {
        let err = distlock::connect(url).await.unwrap_err();
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
}

/// Empty and oversized keys, a zero TTL and a TTL longer than the session timeout are
/// refused before any I/O; keys of any bytes (slashes, dots, the server's own names) are
/// distinct locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_and_ttls_are_refused_and_odd_keys_work() {
    let url = url("bad", "session_timeout=4s");
    let backend = backend(&url).await;
    assert_eq!(backend.session_timeout(), Duration::from_secs(4));
    let locker = Locker::new(backend);
    let opts = LockOptions::new().ttl(Duration::from_secs(2)).skip();
    let empty = locker.acquire("", &opts).await;
    assert!(matches!(empty, Err(Error::InvalidKey { .. })), "{empty:?}");
    let long = "k".repeat(distlock::MAX_KEY_LEN + 1);
    let long = locker.acquire(long.as_str(), &opts).await;
    assert!(matches!(long, Err(Error::InvalidKey { .. })), "{long:?}");
    let zero = locker
        .acquire("k", &LockOptions::new().ttl(Duration::ZERO).skip())
        .await;
    assert!(matches!(zero, Err(Error::InvalidTtl { .. })), "{zero:?}");
    let absurd = locker
        .acquire("k", &LockOptions::new().ttl(Duration::from_secs(5)).skip())
        .await
        .unwrap_err();
    assert!(matches!(absurd, Error::InvalidTtl { .. }), "{absurd:?}");
    assert!(
        absurd.to_string().contains("session_timeout"),
        "the error names the URL parameter: {absurd}"
    );
    let max = "é".repeat(distlock::MAX_KEY_LEN / 2);
    let mut guards = Vec::new();
    for k in [
        "a/b",
        "a%2Fb",
        ".",
        "..",
        "zookeeper",
        "sp ace",
        "\u{0}",
        max.as_str(),
    ] {
        guards.push(
            locker
                .acquire(k, &opts)
                .await
                .unwrap_or_else(|e| panic!("{k:?}: {e}")),
        );
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
}
