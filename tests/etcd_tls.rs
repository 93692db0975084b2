//! The etcd backend over TLS and with etcd's users and roles, against real `etcd` members
//! serving clients over TLS only (certificates made for the run by lock-testkit): the
//! conformance suite with the right CA and a client certificate, and clean errors for a
//! wrong CA, a missing client certificate, a plain-text client on a TLS port, a TLS client
//! on a plain port, a user without permission on the key prefix and a wrong password.

mod common;

use common::tls::{connect_err, round_trip};

use std::time::Duration;

use distlock::etcd::EtcdBackend;
use distlock::{Error, Locker};
use lock_testkit::{EtcdOptions, EtcdServer, EtcdUser, TestCerts};

/// Bound on "fails within its timeout" checks, over the 500 ms the URLs below set.
const WITHIN: Duration = Duration::from_millis(1500);

async fn tls_member(certs: &TestCerts, client_certs: bool) -> EtcdServer {
    EtcdServer::start_with(EtcdOptions {
        tls: Some(certs.server_tls(client_certs)),
        ..EtcdOptions::default()
    })
    .await
}

/// The whole conformance suite over TLS with the test CA and a client certificate
/// (`?ca=&cert=&key=`) against a member demanding one; the builder's TLS options get
/// through too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_over_mutual_tls() {
    let certs = TestCerts::generate();
    let member = tls_member(&certs, true).await;
    let url = format!("{}&prefix=tls/&timeout=2s", member.url());
    assert!(url.contains("ca=") && url.contains("cert="), "{url}");
    common::conformance_through_connect(&url, |_| {}).await;

    let backend = EtcdBackend::builder([member.endpoint()])
        .ca_file(certs.ca())
        .client_cert(certs.client_cert(), certs.client_key())
        .build()
        .await
        .expect("connect with the builder");
    round_trip(&Locker::new(backend)).await;
}

/// A CA that did not sign the member's certificate, and the system's roots (`tls=true`):
/// a non-transient error naming the certificate, within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_refused_clearly() {
    let certs = TestCerts::generate();
    let member = tls_member(&certs, false).await;
    for url in [
        format!(
            "etcd://{}?ca={}&timeout=500ms",
            member.endpoint(),
            certs.other_ca().display()
        ),
        format!("etcd://{}?tls=true&timeout=500ms", member.endpoint()),
    ] {
        let (e, took) = connect_err(&url).await;
        assert!(matches!(e, Error::Backend { .. }), "{url}: {e:?}");
        assert!(e.report().to_string().contains("not trusted"), "{e}");
        assert!(took < WITHIN, "{url}: {took:?}");
    }
}

/// A member demanding client certificates, reached without one: an error naming the
/// client certificate, within the timeout. (Non-transient when the member's alert arrives;
/// with TLS 1.3 it may be lost with the connection, which then reads as a closed
/// connection, transient like any other.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_client_certificate_is_named() {
    let certs = TestCerts::generate();
    let member = tls_member(&certs, true).await;
    let url = format!(
        "etcd://{}?ca={}&timeout=500ms",
        member.endpoint(),
        certs.ca().display()
    );
    let (e, took) = connect_err(&url).await;
    assert!(
        matches!(e, Error::Unavailable { .. } | Error::Backend { .. }),
        "{e:?}"
    );
    assert!(e.report().to_string().contains("client certificate"), "{e}");
    assert!(took < WITHIN, "{took:?}");
}

/// A plain-text client against the TLS port: an error within the timeout pointing at TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_on_a_tls_port_fails_clearly() {
    let certs = TestCerts::generate();
    let member = tls_member(&certs, false).await;
    let url = format!("etcd://{}?timeout=500ms", member.endpoint());
    let (e, took) = connect_err(&url).await;
    assert!(
        matches!(e, Error::Unavailable { .. } | Error::Backend { .. }),
        "{e:?}"
    );
    assert!(e.report().to_string().contains("tls=true"), "{e}");
    assert!(took < WITHIN, "{took:?}");
}

/// A TLS client against a plain-text member: an error within the timeout naming TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_on_a_plain_port_fails_clearly() {
    let certs = TestCerts::generate();
    let member = EtcdServer::start().await;
    let url = format!(
        "etcd://{}?ca={}&timeout=500ms",
        member.endpoint(),
        certs.ca().display()
    );
    let (e, took) = connect_err(&url).await;
    assert!(
        matches!(e, Error::Unavailable { .. } | Error::Backend { .. }),
        "{e:?}"
    );
    assert!(e.report().to_string().contains("TLS"), "{e}");
    assert!(took < WITHIN, "{took:?}");
}

/// A CA file that does not exist: `InvalidUrl` naming it, before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_ca_file_is_invalid_input() {
    let (e, _) = connect_err("etcd://127.0.0.1:1?ca=/nonexistent/ca.pem").await;
    assert!(matches!(e, Error::InvalidUrl { .. }), "{e:?}");
    assert!(
        e.report().to_string().contains("/nonexistent/ca.pem"),
        "{e}"
    );
}

/// With authentication on, a user whose role grants the lock prefix locks (over TLS); a
/// user granted another prefix only, and a wrong password, get non-transient errors at
/// connect that name the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_are_held_to_their_prefix() {
    let certs = TestCerts::generate();
    let member = tls_member(&certs, false).await;
    let user = |name: &str, prefix: &str| EtcdUser {
        name: name.to_owned(),
        password: format!("{name}-pw"),
        prefix: prefix.to_owned(),
    };
    member
        .enable_auth(
            "root-pw",
            &[
                user("locker", distlock::etcd::DEFAULT_PREFIX),
                user("other", "elsewhere/"),
            ],
        )
        .await;
    let as_user = |name: &str, password: &str| {
        member
            .url()
            .replacen("etcd://", &format!("etcd://{name}:{password}@"), 1)
    };
    let allowed = distlock::connect(&as_user("locker", "locker-pw"))
        .await
        .expect("the permitted user connects");
    round_trip(&allowed).await;

    let (e, took) = connect_err(&as_user("other", "other-pw")).await;
    assert!(!e.is_transient(), "{e:?}");
    assert!(e.report().to_string().contains("permission"), "{e}");
    assert!(took < WITHIN, "{took:?}");

    let (e, took) = connect_err(&as_user("locker", "wrong")).await;
    assert!(!e.is_transient(), "{e:?}");
    assert!(
        !e.report().to_string().contains("wrong"),
        "the password is not shown: {e}"
    );
    assert!(
        e.report().to_string().contains("user name and password"),
        "{e}"
    );
    assert!(took < WITHIN, "{took:?}");
}
