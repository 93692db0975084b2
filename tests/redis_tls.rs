//! The Redis backend over TLS and with ACL users, against real `redis-server` processes
//! listening with TLS only (certificates made for the run by lock-testkit): the conformance
//! suite over `rediss://` with the right CA, mutual TLS, and clean errors for a wrong CA, a
//! plain-text client on a TLS port, a TLS client on a plain port, an ACL user without
//! permission on the key prefix and a wrong password.

mod common;

use common::tls::{connect_err, round_trip};

use std::time::{Duration, Instant, SystemTime};

use distlock::redis::CAPABILITIES;
use distlock::{Error, LockOptions, Locker};
use lock_testkit::{RedisOptions, RedisServer, TestCerts};

/// Bound on "fails within its timeout" checks, over the 500 ms the URLs below set.
const WITHIN: Duration = Duration::from_millis(1500);

async fn tls_server(certs: &TestCerts, client_certs: bool) -> RedisServer {
    RedisServer::start_with(RedisOptions {
        tls: Some(certs.server_tls(client_certs)),
        ..RedisOptions::default()
    })
    .await
}

/// The whole conformance suite over `rediss://` trusting the test CA (`?ca=`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_over_tls() {
    let certs = TestCerts::generate();
    let server = tls_server(&certs, false).await;
    let url = format!("{}&prefix=tls%3A&timeout=2s", server.url());
    assert!(url.starts_with("rediss://"), "{url}");
    common::conformance_through_connect(&url, |caps| assert_eq!(caps, &CAPABILITIES)).await;
}

/// A server demanding client certificates: the builder's `ca_file` and `client_cert` get
/// through, a client without a certificate is refused with a message saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls() {
    let certs = TestCerts::generate();
    let server = tls_server(&certs, true).await;
    let backend = distlock::redis::RedisBackend::builder(server.addr().to_string())
        .tls(true)
        .ca_file(certs.ca())
        .client_cert(certs.client_cert(), certs.client_key())
        .build()
        .await
        .expect("connect with a client certificate");
    round_trip(&Locker::new(backend)).await;
    round_trip(
        &distlock::connect(&server.url())
            .await
            .expect("connect by URL"),
    )
    .await;

    let url = format!(
        "rediss://{}?ca={}&timeout=500ms",
        server.addr(),
        certs.ca().display()
    );
    let (e, took) = connect_err(&url).await;
    assert!(!e.is_transient(), "{e:?}");
    assert!(e.report().to_string().contains("client certificate"), "{e}");
    assert!(took < WITHIN, "{took:?}");
}

/// A CA that did not sign the server's certificate, and the system's roots (no `ca=`): a
/// non-transient error naming the certificate, within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_refused_clearly() {
    let certs = TestCerts::generate();
    let server = tls_server(&certs, false).await;
    for url in [
        format!(
            "rediss://{}?ca={}&timeout=500ms",
            server.addr(),
            certs.other_ca().display()
        ),
        format!("rediss://{}?timeout=500ms", server.addr()),
    ] {
        let (e, took) = connect_err(&url).await;
        assert!(matches!(e, Error::Backend { .. }), "{url}: {e:?}");
        assert!(e.report().to_string().contains("not trusted"), "{e}");
        assert!(took < WITHIN, "{url}: {took:?}");
    }
}

/// `redis://` (plain text) against the TLS port: an error within the timeout whose message
/// points at `rediss://`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_on_a_tls_port_fails_clearly() {
    let certs = TestCerts::generate();
    let server = tls_server(&certs, false).await;
    let (e, took) = connect_err(&format!("redis://{}?timeout=500ms", server.addr())).await;
    assert!(
        matches!(e, Error::Unavailable { .. } | Error::Backend { .. }),
        "{e:?}"
    );
    assert!(e.report().to_string().contains("rediss://"), "{e}");
    assert!(took < WITHIN, "{took:?}");
}

/// `rediss://` against a plain-text server: an error within the timeout naming TLS as the
/// likely cause (a plain server waits for the end of the line it takes the TLS greeting
/// for, so this is the timeout of the first `PING`; a peer that answers with something
/// that is not TLS is the non-transient "does not speak TLS").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_on_a_plain_port_fails_clearly() {
    let certs = TestCerts::generate();
    let server = RedisServer::start().await;
    let url = format!(
        "rediss://{}?ca={}&timeout=500ms",
        server.addr(),
        certs.ca().display()
    );
    let (e, took) = connect_err(&url).await;
    assert!(
        matches!(e, Error::Unavailable { .. } | Error::Backend { .. }),
        "{e:?}"
    );
    let text = e.report().to_string();
    assert!(
        text.contains("does the server speak TLS") || text.contains("does not speak TLS"),
        "{e}"
    );
    assert!(took < WITHIN, "{took:?}");
}

/// A CA file that does not exist: `InvalidUrl` naming it, before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_ca_file_is_invalid_input() {
    let (e, _) = connect_err("rediss://127.0.0.1:1?ca=/nonexistent/ca.pem").await;
    assert!(matches!(e, Error::InvalidUrl { .. }), "{e:?}");
    assert!(
        e.report().to_string().contains("/nonexistent/ca.pem"),
        "{e}"
    );
}

/// The minimal ACL of lock-redis' README, for keys and channels under `prefix`.
fn acl(user: &str, password: &str, prefix: &str) -> String {
    format!(
        "{user} on >{password} resetkeys ~{prefix}* resetchannels &{prefix}* -@all \
         +ping +eval +evalsha +get +set +del +exists +pexpire +pttl +time +publish \
         +subscribe +unsubscribe +lpush +ltrim +lrange +lset +lrem +append +pexpireat +zadd \
         +zrem +zscore +zrange +zrangebyscore +zremrangebyscore +hget +hdel +hincrby +hset +hmget"
    )
}

/// An ACL user granted the prefix (the README's minimal ACL) locks, over TLS too; a user
/// granted another prefix only, and a wrong password, get non-transient errors that name
/// the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_users_are_held_to_their_prefix() {
    let certs = TestCerts::generate();
    let server = RedisServer::start_with(RedisOptions {
        tls: Some(certs.server_tls(false)),
        users: vec![
            acl("locker", "lock-pw", "distlock:"),
            acl("other", "other-pw", "elsewhere:"),
            // The prefix, but not the claims' commands (an ACL from before they existed).
            acl("older", "older-pw", "distlock:").replace(" +hset +hmget", ""),
        ],
        ..RedisOptions::default()
    })
    .await;
    let allowed = distlock::connect(&server.url_as_user("locker", Some("lock-pw")))
        .await
        .expect("the permitted user connects");
    round_trip(&allowed).await;
    common::conformance_through_connect(
        &format!(
            "{}&timeout=2s",
            server.url_as_user("locker", Some("lock-pw"))
        ),
        |_| {},
    )
    .await;

    let other = distlock::connect(&server.url_as_user("other", Some("other-pw")))
        .await
        .expect("connecting needs no key");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(5));
    let started = Instant::now();
    let e = other
        .acquire("forbidden", &opts)
        .await
        .expect_err("no permission on distlock:*");
    eprintln!("{e}");
    assert!(!e.is_transient(), "{e:?}");
    assert!(e.report().to_string().contains("permission"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "not retried as transient: {:?}",
        started.elapsed()
    );

    // A claim refused by the ACL says so, and is not taken for a foreign value.
    let older = distlock::connect(&server.url_as_user("older", Some("older-pw")))
        .await
        .expect("the older user connects");
    let e = older
        .claim_fire_time("jobs/acl", SystemTime::now(), "r")
        .await
        .expect_err("no HMGET for the older ACL");
    eprintln!("{e}");
    assert!(!e.is_transient(), "{e:?}");
    let text = e.report().to_string();
    assert!(
        text.contains("permission") && !text.contains("not a fire-time claim"),
        "{e}"
    );

    let (e, took) = connect_err(&server.url_as_user("locker", Some("wrong"))).await;
    assert!(!e.is_transient(), "{e:?}");
    assert!(
        e.report().to_string().contains("authentication refused"),
        "{e}"
    );
    assert!(took < WITHIN, "{took:?}");
}
