//! Configuration and bad input

use super::*;

/// The capabilities follow what the server grants: a lock's lease is 1 s longer than the
/// lock, so the shortest lock is the server's shortest lease less 1 s (at least 1 s);
/// whole seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_report_the_servers_shortest_lease() {
    let server = EtcdServer::start().await;
    let b = backend(&[server.endpoint()], "").await;
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let granted = client.lease_grant(1, None).await.unwrap();
    let caps = b.capabilities();
    let shortest_lease = Duration::from_secs(granted.ttl() as u64);
    assert_eq!(
        caps.min_ttl,
        (shortest_lease - Duration::from_secs(1)).max(Duration::from_secs(1))
    );
    assert_eq!(caps.ttl_granularity, Duration::from_secs(1));
    assert!(caps.monotonic_fencing && caps.release_notices && caps.cross_process);
    assert_eq!(
        caps.effective_ttl(Duration::from_millis(1500))
            .unwrap()
            .get(),
        Duration::from_secs(2)
    );
    assert_eq!(b.prefix(), "distlock/");
    assert_eq!(b.timeout(), Duration::from_secs(2));
}

/// Idle leases are recycled, not leaked: after many cycles the backend keeps at most a
/// few, holds none, and etcd has no more leases than that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_recycled_not_leaked() {
    let server = EtcdServer::start().await;
    let b = Arc::new(backend(&[server.endpoint()], "").await);
    let locker = Locker::with_backend(b.clone());
    let k = key("recycle");
    for _ in 0..50 {
        let g = locker
            .acquire(&k, &opts(Duration::from_secs(30)))
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    assert_eq!(b.held_leases(), 0);
    assert_eq!(b.idle_leases(), 1);
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let leases = client.leases().await.unwrap();
    assert_eq!(leases.leases().len(), 1, "one lease served 50 locks");
}

/// An endpoint where nothing listens, or that never answers, fails within the timeout with
/// a transient error naming the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_fails_within_the_timeout() {
    // Nothing listens there, and nothing else can be given it while `closed` lives.
    let closed = lock_testkit::closed_port();
    let port = closed.port();
    let started = Instant::now();
    let refused = distlock::connect(&format!("etcd://127.0.0.1:{port}?timeout=500ms")).await;
    assert!(started.elapsed() <= Duration::from_millis(800));
    match refused {
        Err(e @ Error::Unavailable { .. }) => {
            assert!(
                e.report()
                    .to_string()
                    .contains(&format!("127.0.0.1:{port}")),
                "{e}"
            )
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }

    let server = EtcdServer::start().await;
    let proxy = FaultProxy::start(server.addr()).await;
    proxy.set_mode(ProxyMode::Blackhole);
    let started = Instant::now();
    let silent = distlock::connect(&format!("etcd://{}?timeout=500ms", proxy.addr())).await;
    assert!(started.elapsed() <= Duration::from_millis(800));
    assert!(
        matches!(silent, Err(Error::Unavailable { .. })),
        "{silent:?}"
    );
}

/// Malformed URLs, unknown parameters and bad settings are refused with `InvalidUrl`,
/// before any I/O and without showing the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_settings_are_refused() {
    let bad = [
        "etcd://",
        "etcd://host/path",
        "etcd://host,",
        "etcd://host:99999",
        "etcd://host?timeout=fast",
        "etcd://host?timeout=0ms",
        "etcd://host?prefix=",
        "etcd://host?colour=red",
        "etcd://host?prefix=a&ttl=3s",
        "etcd://:hunter2@host",
    ];
    for url in bad {
        let refused = distlock::connect(url).await;
        match refused {
            Err(Error::InvalidUrl { url: shown, reason }) => {
                assert!(!shown.contains("hunter2"), "{shown}");
                assert!(!reason.is_empty());
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
    let redis = LockUrl::parse("redis://host").unwrap();
    assert!(matches!(
        EtcdBackend::connect(&redis).await,
        Err(Error::InvalidUrl { .. })
    ));
    for builder in [
        EtcdBackend::builder(Vec::<String>::new()),
        EtcdBackend::builder(["https://host:2379"]),
        EtcdBackend::builder(["host name:2379"]),
        EtcdBackend::builder(["host:2379"]).prefix(""),
        EtcdBackend::builder(["host:2379"]).timeout(Duration::ZERO),
    ] {
        let debug = format!("{builder:?}");
        assert!(
            matches!(builder.build().await, Err(Error::InvalidUrl { .. })),
            "{debug}"
        );
    }
}

/// The typed builder and the URL give the same configuration; `Debug` hides the password.
#[test]
fn builder_and_url_agree_and_debug_hides_the_password() {
    let url = LockUrl::parse("etcd://root:hunter2@a:2379,b?prefix=app/&timeout=750ms").unwrap();
    let from_url = distlock::etcd::EtcdBuilder::from_url(&url).unwrap();
    let typed = EtcdBackend::builder(["a:2379", "b:2379"])
        .username("root")
        .password("hunter2")
        .prefix("app/")
        .timeout(Duration::from_millis(750));
    assert_eq!(from_url, typed);
    let debug = format!("{typed:?}");
    assert!(
        !debug.contains("hunter2") && debug.contains("root"),
        "{debug}"
    );
}

/// With authentication on, the URL's credentials are used; wrong ones are a non-transient
/// error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_used_and_wrong_ones_refused() {
    let server = EtcdServer::start().await;
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    client.user_add("root", "hunter2", None).await.unwrap();
    client.user_grant_role("root", "root").await.unwrap();
    client.auth_enable().await.unwrap();

    let wrong = distlock::connect(&format!("etcd://root:nope@{}", server.endpoint())).await;
    match wrong {
        Err(e @ Error::Backend { .. }) => assert!(!e.report().to_string().contains("nope"), "{e}"),
        other => panic!("expected a Backend error, got {other:?}"),
    }
    let anonymous = distlock::connect(&format!("etcd://{}", server.endpoint())).await;
    assert!(
        matches!(anonymous, Err(Error::Backend { .. })),
        "{anonymous:?}"
    );

    let locker = distlock::connect(&format!("etcd://root:hunter2@{}", server.endpoint()))
        .await
        .unwrap();
    let g = locker
        .acquire(&key("auth"), &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    g.release().await.unwrap();
}

/// etcd's authentication tokens expire (here after 1 s; 5 min by default) and etcd-client
/// does not renew them: the backend asks for a new token when etcd reports an expired one,
/// and the caller's retry succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_auth_token_is_renewed() {
    let server = EtcdServer::start_with_args(&["--auth-token-ttl", "1"]).await;
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    client.user_add("root", "hunter2", None).await.unwrap();
    client.user_grant_role("root", "root").await.unwrap();
    client.auth_enable().await.unwrap();
    let locker = distlock::connect(&format!("etcd://root:hunter2@{}", server.endpoint()))
        .await
        .unwrap();
    let ttl = Duration::from_secs(10);
    let g = locker.acquire(&key("token"), &opts(ttl)).await.unwrap();
    g.release().await.unwrap();

    tokio::time::sleep(Duration::from_secs(3)).await;
    let g = locker
        .acquire(&key("token"), &opts(ttl).wait_for(Duration::from_secs(5)))
        .await
        .expect("a new token is used once the old one expired");
    g.release().await.unwrap();
}
