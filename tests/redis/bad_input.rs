//! Bad input: unreachable, unresolvable, wrong password, malformed URLs, foreign servers.

use super::*;

/// A port nobody listens on: `Unavailable` (transient) at once, naming the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_port_is_unavailable() {
    // Nothing listens there, and nothing else can be given it while `closed` lives.
    let closed = lock_testkit::closed_port();
    let port = closed.port();
    let started = Instant::now();
    let e = connect_err(&format!("redis://127.0.0.1:{port}")).await;
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    let report = e.report().to_string();
    assert!(report.contains("refused"), "{report}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// A host name that does not resolve: an error within the timeout, no hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolvable_host_fails_within_the_timeout() {
    let started = Instant::now();
    let e = connect_err("redis://no-such-host.invalid:6379?timeout=500ms").await;
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(started.elapsed() <= Duration::from_millis(500) + SLACK);
}

/// Wrong or missing password: a non-transient `Backend` error saying authentication was
/// refused, never showing the password; the right one connects, and `Debug` hides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_a_clear_backend_error() {
    let server = RedisServer::start_with(RedisOptions {
        password: Some("s3cret-pw".into()),
        ..RedisOptions::default()
    })
    .await;
    let port = server.port();
    for url in [
        format!("redis://:not-it@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
        format!("redis://someone:s3cret-pw@127.0.0.1:{port}"),
    ] {
        let e = connect_err(&url).await;
        assert!(matches!(e, Error::Backend { .. }), "{url}: {e:?}");
        assert!(!e.is_transient());
        let text = e.report().to_string();
        assert!(text.contains("authentication"), "{url}: {text}");
        assert!(
            !text.contains("not-it") && !text.contains("s3cret"),
            "{text}"
        );
    }
    let right = backend(&server.url()).await;
    let shown = format!("{right:?} {:?}", right.node());
    assert!(
        !shown.contains("s3cret") && shown.contains(":***@"),
        "{shown}"
    );
    let locker = distlock::connect(&server.url())
        .await
        .expect("right password");
    let g = locker
        .acquire("auth/x", &skip(Duration::from_secs(1)))
        .await
        .unwrap();
    g.release().await.unwrap();
}

/// Malformed URLs and unknown parameters: `InvalidUrl`, before any I/O, password hidden.
#[tokio::test]
async fn malformed_urls_are_invalid_url() {
    for url in [
        "redis://",
        "redis://:pw-hidden@h:6379?unknown=1",
        "redis://h:6379?timeout=fast",
        "redis://h:6379?timeout=0s",
        "redis://h:6379/db",
        "redis://h:99999",
        "redis://h1:6379,h2:6379",
        "redis://h:6379#frag",
        "redis:/h:6379",
        "rediss://h:6379?prefix=a&tls=1",
    ] {
        match connect_err(url).await {
            Error::InvalidUrl { url: shown, .. } => {
                assert!(!shown.contains("pw-hidden"), "{shown}")
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
}

/// A server that answers with something other than RESP: a non-transient `Backend` error
/// saying so, quickly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_redis_server_is_a_clear_backend_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    .await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            });
        }
    });
    let started = Instant::now();
    let e = connect_err(&format!("redis://{addr}")).await;
    assert!(matches!(e, Error::Backend { .. }), "{e:?}");
    assert!(e.report().to_string().contains("Redis protocol"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(1));
    server.abort();
}

/// An etcd client port (HTTP/2, not RESP): an error within the timeout, no hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_port_is_not_redis() {
    let etcd = EtcdServer::start().await;
    let started = Instant::now();
    let e = connect_err(&format!("redis://{}?timeout=500ms", etcd.addr())).await;
    assert!(!matches!(e, Error::InvalidUrl { .. }), "{e:?}");
    assert!(started.elapsed() <= Duration::from_millis(500) + SLACK);
}

/// A server that accepts and never answers: `Unavailable` after the timeout, no hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_server_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let started = Instant::now();
    let e = connect_err(&format!("redis://{addr}?timeout=300ms")).await;
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(e.report().to_string().contains("no answer"), "{e}");
    assert!(started.elapsed() <= Duration::from_millis(300) + SLACK);
    server.abort();
}

/// `rediss://` against a plain-text Redis: an error within the timeout, no hang, no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_against_a_plain_server_fails_cleanly() {
    let server = RedisServer::start().await;
    let started = Instant::now();
    let e = connect_err(&format!(
        "rediss://127.0.0.1:{}?timeout=500ms",
        server.port()
    ))
    .await;
    assert!(
        matches!(e, Error::Unavailable { .. } | Error::Backend { .. }),
        "{e:?}"
    );
    assert!(started.elapsed() <= Duration::from_millis(500) + SLACK);
}
