//! Bad input

use super::*;

/// Nothing listens: a transient `Unavailable` naming the address, within the timeout
/// ([`sql::an_unreachable_port_is_unavailable_within_the_timeout`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_port_is_unavailable_within_the_timeout() {
    sql::an_unreachable_port_is_unavailable_within_the_timeout::<Postgres>().await;
}

/// A wrong password is a permanent `Backend` error that says so, never showing the
/// password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused() {
    let server = PostgresServer::start().await;
    let url = format!("postgres://postgres:hunter2@{}/postgres", server.addr());
    let err = PostgresBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    let text = err.report().to_string();
    assert!(text.contains("authentication refused"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(!format!("{err:?}").contains("hunter2"));
}

/// A server that does not speak PostgreSQL (it answers garbage and hangs up) is refused
/// within the timeout with an error that says what to check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_postgres_is_refused() {
    let err = sql::connecting_to_a_server_that_answers_garbage::<Postgres>().await;
    let text = err.report().to_string();
    assert!(text.contains("PostgreSQL"), "{text}");
}

/// A table or schema that is not a plain identifier is refused before anything is sent:
/// nothing listens on the port, and the error is `InvalidUrl`, not `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_table_names_are_refused_before_any_sql() {
    for params in [
        "table=leases;DROP%20TABLE%20x",
        "table=%22x%22",
        "table=a.b",
        "schema=pg%20catalog",
        "table=",
        "table=x--",
    ] {
        let url = format!("postgres://127.0.0.1:1/db?{params}");
        match distlock::connect(&url).await {
            Err(Error::InvalidUrl { reason, .. }) => {
                assert!(reason.contains("identifier"), "{params}: {reason}")
            }
            other => panic!("{params}: expected InvalidUrl, got {:?}", other.err()),
        }
    }
    assert!(matches!(
        PostgresBackend::builder("127.0.0.1:1")
            .table("x'y")
            .build()
            .await,
        Err(Error::InvalidUrl { .. })
    ));
}

/// Keys are parameters, never SQL: quotes, NUL, newlines, non-ASCII and the longest key
/// are locked, excluded, inspected and released like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_any_bytes_are_locked_as_given() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=keys");
    let (a, b) = (
        Locker::new(backend(&url).await),
        Locker::new(backend(&url).await),
    );
    let long = "é".repeat(distlock::MAX_KEY_LEN / 2);
    let keys = [
        "'; DROP TABLE keys; --".to_owned(),
        "nul\0byte".to_owned(),
        "line\nbreak\ttab\\".to_owned(),
        "ключ/🔒".to_owned(),
        "$1 %s ? :name".to_owned(),
        long,
    ];
    for k in &keys {
        let guard = a.acquire(k, &LockOptions::new().skip()).await.unwrap();
        assert!(
            matches!(
                b.acquire(k, &LockOptions::new().skip()).await,
                Err(Error::Locked { .. })
            ),
            "{k:?} is excluded"
        );
        let holder = a
            .backend()
            .admin()
            .unwrap()
            .inspect(k)
            .await
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(holder.fence, Some(guard.fence()));
        guard.release().await.unwrap();
        b.acquire(k, &LockOptions::new().skip())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let raw = server.client().await;
    let left: i64 = raw
        .query_one("SELECT count(*) FROM keys", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "every key released, the table intact");
}
