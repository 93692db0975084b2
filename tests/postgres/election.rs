//! Leader election on PostgreSQL: the `<table>_leads` row upserted only while the lease
//! row holds the publisher, and the NOTIFY observers in another process wake on.

use super::*;
use distlock::election::LeaderValues;
use distlock::{Admin, Lease};

/// A campaign of `ttl`, waited for up to 10 s.
fn campaign(ttl: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(ttl)
        .wait_for(Duration::from_secs(10))
}

fn values(backend: &PostgresBackend) -> &dyn LeaderValues {
    backend
        .leader_values()
        .expect("postgres publishes leaders' values")
}

/// The raw row of election `name` in the leaders' table: its owner and value.
async fn raw_value(server: &PostgresServer, table: &str, name: &str) -> Option<(String, Vec<u8>)> {
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    let row = client
        .query_opt(
            &format!("SELECT owner, value FROM {table} WHERE key = $1::bytea"),
            &[&name.as_bytes()],
        )
        .await
        .unwrap();
    driver.abort();
    row.map(|row| (row.get(0), row.get(1)))
}

/// A value left by an earlier leader stays in its row but is never answered for a later
/// holder of the lock: one that acquired it as a plain lock after a resignation, nor one it
/// was handed over to inside one Locker (the row never deleted in between).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_left_by_an_earlier_holder_is_never_answered() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=elect");
    let backend = Arc::new(backend(&url).await);
    let (a, b) = (
        Locker::with_backend(backend.clone()),
        Locker::with_backend(backend.clone()),
    );
    let name = key("stale");
    let ttl = Duration::from_secs(10);
    let leading = a
        .election(&name)
        .unwrap()
        .campaign("a", &campaign(ttl))
        .await
        .unwrap();
    let seen = values(&backend)
        .leader(&name)
        .await
        .unwrap()
        .expect("a leads");
    assert_eq!((seen.value, seen.term), (b"a".to_vec(), leading.term()));
    let owner = leading.guard().lease().owner().to_string();
    leading.resign().await.unwrap();
    // A plain lock holder after it: the value is still stored, never answered.
    let plain = b.acquire(name.as_str(), &campaign(ttl)).await.unwrap();
    assert_eq!(
        raw_value(&server, backend.leaders_table(), &name).await,
        Some((owner, b"a".to_vec())),
        "the earlier leader's value is still in its row"
    );
    assert_eq!(values(&backend).leader(&name).await.unwrap(), None);
    plain.release().await.unwrap();

    // A hand-over inside one Locker: the next holder has not published, so nobody leads.
    let leading = a
        .election(&name)
        .unwrap()
        .campaign("a2", &campaign(ttl))
        .await
        .unwrap();
    let term = leading.term();
    let (a2, name2) = (a.clone(), name.clone());
    let waiter = tokio::spawn(async move { a2.acquire(name2.as_str(), &campaign(ttl)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    leading.resign().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert!(next.fence() > term);
    assert_eq!(
        values(&backend).leader(&name).await.unwrap(),
        None,
        "the handed-over holder has published nothing"
    );
    next.release().await.unwrap();
}

/// A publication by a lease that lost its key is refused with `NotHeld` and changes
/// nothing, even when the lease still looks valid to the caller: the database decides.
/// So is one whose row expired by the database's clock, with nobody else holding it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_by_a_lost_lease_is_refused_and_changes_nothing() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=elect");
    let backend = Arc::new(backend(&url).await);
    let (a, b) = (
        Locker::with_backend(backend.clone()),
        Locker::with_backend(backend.clone()),
    );
    let name = key("lost");
    let old = a
        .election(&name)
        .unwrap()
        .campaign("a", &campaign(Duration::from_secs(10)))
        .await
        .unwrap();
    let old_lease = old.guard().lease();
    let still_valid = |lease: &Lease| {
        Lease::new(
            name.as_str(),
            lease.owner(),
            lease.fence(),
            Instant::now() + Duration::from_secs(10),
        )
    };
    // Force-released: the key goes to the next candidate while the old guard runs on.
    assert!(backend.force_release(&name).await.unwrap());
    let next = b
        .election(&name)
        .unwrap()
        .campaign("b", &campaign(Duration::from_secs(10)))
        .await
        .unwrap();
    match values(&backend)
        .publish(&still_valid(&old_lease), b"late")
        .await
    {
        Err(Error::NotHeld { key }) => assert_eq!(key, name),
        other => panic!("a lost lease published: {other:?}"),
    }
    let seen = values(&backend)
        .leader(&name)
        .await
        .unwrap()
        .expect("b leads");
    assert_eq!((seen.value, seen.term), (b"b".to_vec(), next.term()));
    // The holder's owner with another fence is not its grant either.
    let next_lease = next.guard().lease();
    let other_fence = Lease::new(
        name.as_str(),
        next_lease.owner(),
        next_lease.fence() + 1,
        Instant::now() + Duration::from_secs(10),
    );
    assert!(matches!(
        values(&backend).publish(&other_fence, b"forged").await,
        Err(Error::NotHeld { .. })
    ));
    next.resign().await.unwrap();
    drop(old);

    // Expired by the database's clock, its row still there: refused, and nobody leads.
    let short = a
        .election(&name)
        .unwrap()
        .campaign("c", &campaign(Duration::from_millis(300)).watchdog(false))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(matches!(
        values(&backend)
            .publish(&still_valid(&short.guard().lease()), b"late")
            .await,
        Err(Error::NotHeld { .. })
    ));
    assert_eq!(values(&backend).leader(&name).await.unwrap(), None);
    assert_eq!(
        raw_value(&server, backend.leaders_table(), &name)
            .await
            .map(|(_, v)| v),
        Some(b"c".to_vec()),
        "the refused publication changed nothing"
    );
}

/// How long another process may take to hear of a change: far below the 30 s TTL.
const HEARD_WITHIN: Duration = Duration::from_secs(2);

/// An observer on a second backend (another process: its own connections, its own
/// `LISTEN`) is woken by a publication and by an announcement, each within a bound far
/// below the TTL; and follows a leadership through `observe`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_in_another_process_is_woken_by_publish_and_announce() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=elect");
    let leader_side = Arc::new(backend(&url).await);
    let observer_side = Arc::new(backend(&url).await);
    let name = key("observed");
    let ttl = Duration::from_secs(30);

    let locker = Locker::with_backend(leader_side.clone());
    let mut leading = locker
        .election(&name)
        .unwrap()
        .campaign("v1", &campaign(ttl))
        .await
        .unwrap();
    // The subscription starts with the first listener; its start wakes every listener once.
    let mut warm = observer_side.listen(&name).expect("postgres listens");
    tokio::time::timeout(Duration::from_secs(5), warm.released())
        .await
        .expect("the subscription starts");

    // Raw: a listener, then a publication elsewhere.
    let mut listener = observer_side.listen(&name).expect("postgres listens");
    let sent = Instant::now();
    values(&leader_side)
        .publish(&leading.guard().lease(), b"v2")
        .await
        .unwrap();
    tokio::time::timeout(HEARD_WITHIN, listener.released())
        .await
        .expect("a publication wakes another process's listener");
    let heard = sent.elapsed();

    // An announcement alone (nothing else changes) wakes it too.
    let mut listener = observer_side.listen(&name).expect("postgres listens");
    values(&leader_side).announce(&name).await.unwrap();
    tokio::time::timeout(HEARD_WITHIN, listener.released())
        .await
        .expect("an announcement wakes another process's listener");

    // Through the election API: a new value, then a resignation.
    let follower = Locker::with_backend(observer_side.clone());
    let mut watch = follower.election(&name).unwrap().observe();
    let first = watch.changed().await.unwrap().expect("a leads");
    assert_eq!(first.value, b"v2");
    leading.proclaim("v3").await.unwrap();
    let seen = tokio::time::timeout(HEARD_WITHIN, watch.changed())
        .await
        .expect("a proclamation is observed within the bound")
        .unwrap()
        .expect("a still leads");
    assert_eq!((seen.value, seen.term), (b"v3".to_vec(), leading.term()));
    leading.resign().await.unwrap();
    let seen = tokio::time::timeout(HEARD_WITHIN, watch.changed())
        .await
        .expect("a resignation is observed within the bound")
        .unwrap();
    assert_eq!(seen, None);
    drop(warm);
    println!("a publication heard by another process after {heard:?}");
}

/// The leaders' table is made beside the lease table: for the longest table name, and by
/// the next backend that connects when only it is missing (a deployment made before
/// elections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_table_is_made_beside_the_lease_table() {
    let server = PostgresServer::start().await;
    let raw = server.client().await;
    let longest = "l".repeat(distlock::postgres::MAX_IDENTIFIER_LEN - 6);
    let url = postgres_url(server.addr(), &format!("table={longest}"));
    let first = backend(&url).await;
    assert_eq!(
        first.leaders_table(),
        format!("\"public\".\"{longest}_leads\"")
    );
    drop(first);
    raw.batch_execute(&format!("DROP TABLE public.{longest}_leads"))
        .await
        .unwrap();
    let backend = Arc::new(backend(&url).await);
    let locker = Locker::with_backend(backend.clone());
    let name = key("made");
    let leading = locker
        .election(&name)
        .unwrap()
        .campaign("v", &campaign(Duration::from_secs(10)))
        .await
        .unwrap();
    let seen = values(&backend)
        .leader(&name)
        .await
        .unwrap()
        .expect("leads");
    assert_eq!((seen.value, seen.term), (b"v".to_vec(), leading.term()));
    leading.resign().await.unwrap();
}
