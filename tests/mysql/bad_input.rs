//! Bad input

use super::*;

/// Nothing listens: the connection is refused at once, a transient `Unavailable` naming
/// the address, within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_port_is_unavailable_within_the_timeout() {
    let port = lock_testkit::unused_port();
    let url = format!("mysql://root:x@127.0.0.1:{port}/distlock?timeout=500ms");
    let started = Instant::now();
    let err = MysqlBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(500) + common::SLACK);
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_transient());
    let text = err.report().to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains(":x@"), "{text}");
}

/// A wrong password, and a database that does not exist, are permanent `Backend` errors
/// that say so, never showing the password; a URL without a database is refused before
/// any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_and_databases_are_refused() {
    let server = MariaDbServer::start().await;
    let url = format!("mysql://root:hunter2@{}/distlock", server.addr());
    let err = MysqlBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    let text = err.report().to_string();
    assert!(text.contains("authentication refused"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(!format!("{err:?}").contains("hunter2"));

    let url = mysql_url(server.addr(), "").replace("/distlock", "/no_such_db");
    let err = MysqlBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    assert!(!err.is_transient());

    let url = mysql_url(server.addr(), "").replace("/distlock", "");
    let err = distlock::connect(&url).await.unwrap_err();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    assert!(err.to_string().contains("database"), "{err}");
}

/// A server that does not speak the MySQL protocol (it answers garbage and hangs up) is
/// refused within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_mysql_is_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let _ = socket.write_all(b"-ERR unknown command\r\n").await;
                let mut buf = [0u8; 512];
                let _ = socket.read(&mut buf).await;
            });
        }
    });
    let url = format!("mysql://root:x@{addr}/distlock?timeout=1s");
    let started = Instant::now();
    let err = MysqlBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1) + common::SLACK);
    assert!(
        matches!(err, Error::Backend { .. } | Error::Unavailable { .. }),
        "{err:?}"
    );
    peer.abort();
}
