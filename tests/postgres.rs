//! The PostgreSQL backend against real `postgres` processes (lock-testkit): the whole
//! conformance suite (directly, through `Arc<dyn Backend>` and through
//! `distlock::connect`), the shared fault rules behind a fault proxy, fencing across a
//! restart and a `kill -9`, database time against a skewed client, and bad input.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{postgres_backend as backend, postgres_url, rand_u32, Proxied};
use distlock::conformance::{run_faults, Faults, Target};
use distlock::postgres::PostgresBackend;
use distlock::{Attempt, Backend, Error, LockOptions, LockUrl, Locker, Owner};
use lock_testkit::PostgresServer;

fn key(name: &str) -> String {
    format!("{name}-{:08x}", rand_u32())
}

// ---------------------------------------------------------------------------------------
// Conformance
// ---------------------------------------------------------------------------------------

/// The whole suite on one server, with the backend built by the typed builder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_direct() {
    let server = PostgresServer::start().await;
    let backend = PostgresBackend::builder(server.addr().to_string())
        .username("postgres")
        .password(lock_testkit::POSTGRES_PASSWORD)
        .database("postgres")
        .table("conformance")
        .build()
        .await
        .unwrap();
    assert_eq!(backend.capabilities().name, "postgres");
    assert!(backend.capabilities().monotonic_fencing);
    common::conformance_direct(backend).await;
}

/// The whole suite through `Arc<dyn Backend>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_arc_dyn() {
    let server = PostgresServer::start().await;
    let backend = backend(&postgres_url(server.addr(), "table=arc_dyn")).await;
    common::conformance_through_arc_dyn(backend).await;
}

/// The whole suite through `distlock::connect("postgresql://…")`, in a schema of its own
/// that the backend creates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "schema=locks&table=connected").replacen(
        "postgres://",
        "postgresql://",
        1,
    );
    common::conformance_through_connect(&url, |caps| {
        assert_eq!(caps.name, "postgres");
        assert!(caps.monotonic_fencing && caps.release_notices && caps.cross_process);
    })
    .await;
    let raw = server.client().await;
    let row = raw
        .query_one("SELECT to_regclass('locks.connected') IS NOT NULL", &[])
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0), "the table was made in its schema");
}

/// The safety rules (hand-over, serialized operations, queue entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_rules() {
    let server = PostgresServer::start().await;
    let locker = distlock::connect(&postgres_url(server.addr(), "table=safety"))
        .await
        .unwrap();
    distlock::conformance::run_safety(&Target::from_locker(&locker)).await;
}

// ---------------------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------------------

/// The shared fault rules on one server reached through a fault proxy (the peer too):
/// restarted (PostgreSQL keeps its data: the locks survive), killed, paused (SIGSTOP), or
/// cut off by a blackholed network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules() {
    let server = Proxied::new(vec![PostgresServer::start().await]).await;
    let url = postgres_url(server.addrs()[0], "table=faults&timeout=500ms");
    let faults = Faults::new(Duration::from_millis(500))
        .slack(Duration::from_millis(300))
        .peer(Arc::new(backend(&url).await));
    let faults = server.hooks(faults).await;
    let target = Target::new(Arc::new(backend(&url).await)).with_faults(faults);
    // The data survives a restart: there is no restart that loses the locks.
    run_faults(&target).await.assert_not_run(&[
        "a_restart_that_loses_the_locks_leaves_holders_not_held",
        "waiters_wake_after_a_restart_that_loses_the_locks",
    ]);
}

/// Fences strictly increase from holder to holder across a clean restart and a `kill -9`
/// (crash recovery), the lock connection reconnecting by itself each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_across_a_restart_and_a_kill() {
    let mut server = PostgresServer::start().await;
    let locker =
        Locker::new(backend(&postgres_url(server.addr(), "table=fences&timeout=1s")).await);
    let k = key("fences");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(20))
        .watchdog(false);
    let mut last = 0;
    let mut take = |fence: u64, when: &str| {
        assert!(fence > last, "{when}: fence {fence} after {last}");
        last = fence;
    };
    for round in 0..3 {
        for _ in 0..5 {
            let guard = locker.acquire(&k, &opts).await.unwrap();
            take(guard.fence(), &format!("round {round}"));
            guard.release().await.unwrap();
        }
        match round {
            0 => server.restart().await,
            1 => {
                server.kill();
                server.restart().await;
            }
            _ => {}
        }
    }
    // A lock held over a crash is still held after it (recovery keeps committed rows).
    let held = locker.acquire(&k, &opts).await.unwrap();
    take(held.fence(), "before the crash");
    server.kill();
    server.restart().await;
    let other = Locker::new(backend(&postgres_url(server.addr(), "table=fences")).await);
    assert!(
        matches!(
            other.acquire(&k, &LockOptions::new().skip()).await,
            Err(Error::Locked { .. })
        ),
        "the lock survives the crash"
    );
    held.release().await.unwrap();
    let next = other.acquire(&k, &LockOptions::new().skip()).await.unwrap();
    take(next.fence(), "after the crash");
}

/// Expiry is the database's: what the client would compute does not enter the statement.
/// A lease granted for 2 s expires 2 s after the database's clock at the grant (as read
/// by another session), and a holder's TTL is only ever counted from the database's now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_is_measured_on_the_database_clock() {
    let server = PostgresServer::start().await;
    let backend = backend(&postgres_url(server.addr(), "table=skew")).await;
    let raw = server.client().await;
    let k = key("skew");
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(2))
        .unwrap();
    let before: f64 = raw
        .query_one("SELECT extract(epoch from clock_timestamp())::float8", &[])
        .await
        .unwrap()
        .get(0);
    let Attempt::Granted { .. } = backend.try_acquire(&k, Owner::random(), ttl).await.unwrap()
    else {
        panic!("a free key is granted")
    };
    let after: f64 = raw
        .query_one("SELECT extract(epoch from clock_timestamp())::float8", &[])
        .await
        .unwrap()
        .get(0);
    let expires: f64 = raw
        .query_one(
            "SELECT extract(epoch from expires_at)::float8 FROM skew WHERE key = $1",
            &[&k.as_bytes()],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        expires >= before + 2.0 && expires <= after + 2.0,
        "expiry {expires} is the database's grant time + 2 s ({before}..{after})"
    );
    // A second owner is told the holder's time left by the database.
    match backend.try_acquire(&k, Owner::random(), ttl).await.unwrap() {
        Attempt::Taken {
            expires_in: Some(left),
        } => assert!(
            left <= Duration::from_secs(2) && left > Duration::from_secs(1),
            "{left:?}"
        ),
        other => panic!("expected Taken with the time left, got {other:?}"),
    }
}

/// The same owner asking again while it holds the key (a request re-sent after a lost
/// reply) is granted again with the same fence and a FRESH expiry, counted from the new
/// statement: the guard's validity is counted from before that request, so the row must
/// not keep an older, earlier expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_again_as_the_holder_renews_the_expiry() {
    let server = PostgresServer::start().await;
    let backend = backend(&postgres_url(server.addr(), "table=again")).await;
    let raw = server.client().await;
    let k = key("again");
    let owner = Owner::random();
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(3))
        .unwrap();
    let expiry = || async {
        let row = raw
            .query_one(
                "SELECT extract(epoch from expires_at)::float8 FROM again WHERE key = $1",
                &[&k.as_bytes()],
            )
            .await
            .unwrap();
        row.get::<_, f64>(0)
    };
    let Attempt::Granted { fence, .. } = backend.try_acquire(&k, owner, ttl).await.unwrap() else {
        panic!("a free key is granted")
    };
    let first = expiry().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let Attempt::Granted { fence: again, .. } = backend.try_acquire(&k, owner, ttl).await.unwrap()
    else {
        panic!("the holder asking again is granted")
    };
    assert_eq!(again, fence, "the same grant, the same fence");
    let second = expiry().await;
    assert!(
        second >= first + 0.4,
        "the expiry moved with the new request: {first} -> {second}"
    );
}

// ---------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------

/// Nothing listens: the connection is refused at once, a transient `Unavailable` naming
/// the address, within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_port_is_unavailable_within_the_timeout() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("postgres://postgres:x@127.0.0.1:{port}/postgres?timeout=500ms");
    let started = Instant::now();
    let err = PostgresBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(500) + common::SLACK);
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_transient());
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains(":x@"), "{text}");
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
    let text = err.to_string();
    assert!(text.contains("authentication refused"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(!format!("{err:?}").contains("hunter2"));
}

/// A server that does not speak PostgreSQL (it answers garbage and hangs up) is refused
/// within the timeout with an error that says what to check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_postgres_is_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 512];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(b"-ERR unknown command\r\n").await;
            });
        }
    });
    let url = format!("postgres://postgres:x@{addr}/postgres?timeout=1s");
    let started = Instant::now();
    let err = PostgresBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1) + common::SLACK);
    let text = err.to_string();
    assert!(text.contains("PostgreSQL"), "{text}");
    peer.abort();
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

/// A waiter in another process is woken by the release's NOTIFY, not by polling: it gets
/// the lock well before the holder's TTL would have passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_process_is_woken_by_notify() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=notify");
    let (a, b) = (
        Locker::new(backend(&url).await),
        Locker::new(backend(&url).await),
    );
    let k = key("notify");
    let held = a
        .acquire(&k, &LockOptions::new().ttl(Duration::from_secs(20)).skip())
        .await
        .unwrap();
    let waiter = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait_for(Duration::from_secs(15));
            let guard = b.acquire(&k, &opts).await.unwrap();
            (Instant::now(), guard)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (granted, guard) = waiter.await.unwrap();
    let after = granted.duration_since(released);
    assert!(
        after < Duration::from_millis(500),
        "woken {after:?} after the release"
    );
    guard.release().await.unwrap();
}

/// Run records live in `<table>_runs`, made beside the lease table also when only it is
/// missing (an older deployment), and also for the longest table name; a foreign value in
/// it is `Error::Backend`, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_records_have_a_table_of_their_own_and_refuse_foreign_values() {
    use distlock::records::{RunOutcome, RunRecords};

    let server = PostgresServer::start().await;
    let raw = server.client().await;
    let url = postgres_url(server.addr(), "table=records");
    let first = backend(&url).await;
    assert_eq!(first.runs_table(), "\"public\".\"records_runs\"");
    drop(first);
    raw.batch_execute("DROP TABLE public.records_runs")
        .await
        .unwrap();
    let b = backend(&url).await;
    let records: &dyn RunRecords = b.run_records().expect("postgres keeps run records");
    for n in 0..4 {
        let outcome = if n == 0 {
            RunOutcome::Ok
        } else {
            RunOutcome::Failed
        };
        records
            .append(&common::run_record("job", n, outcome), 2)
            .await
            .unwrap();
    }
    let rows: i64 = raw
        .query_one("SELECT count(*) FROM public.records_runs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 3, "two records and the last success");
    let leases: i64 = raw
        .query_one("SELECT count(*) FROM public.records", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(leases, 0, "nothing in the lease table");

    // Foreign values.
    raw.execute(
        "INSERT INTO public.records_runs (job, id, record) VALUES ('\\x6f74686572', 0, 'x'), \
         ('\\x6f74686572', 7, '{\"v\":1}')",
        &[],
    )
    .await
    .unwrap();
    assert!(matches!(
        records.recent("other", 10).await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.last_success("other").await,
        Err(Error::Backend { .. })
    ));

    // The longest lease table name still has room for `_runs`.
    let long = "t".repeat(distlock::postgres::MAX_IDENTIFIER_LEN - "_fence".len());
    let b = backend(&postgres_url(server.addr(), &format!("table={long}"))).await;
    let records = b.run_records().unwrap();
    records
        .append(&common::run_record("job", 1, RunOutcome::Ok), 5)
        .await
        .unwrap();
    assert_eq!(
        records.last_success("job").await.unwrap(),
        Some(common::run_record("job", 1, RunOutcome::Ok))
    );
}
