//! Bad input

use super::*;

/// Nothing listens: a transient `Unavailable` naming the address, within the timeout
/// ([`sql::an_unreachable_port_is_unavailable_within_the_timeout`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_port_is_unavailable_within_the_timeout() {
    sql::an_unreachable_port_is_unavailable_within_the_timeout::<Mysql>().await;
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
    let err = sql::connecting_to_a_server_that_answers_garbage::<Mysql>().await;
    assert!(
        matches!(err, Error::Backend { .. } | Error::Unavailable { .. }),
        "{err:?}"
    );
}
