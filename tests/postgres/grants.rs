//! Grants on the database's terms: expiry on its clock, fences in grant order, a
//! holder asking again.

use super::*;

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
    let Attempt::Granted { .. } = backend
        .try_acquire(&k, Owner::random(), distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
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
    match backend
        .try_acquire(&k, Owner::random(), distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
    {
        Attempt::Taken {
            expires_in: Some(left),
        } => assert!(
            left <= Duration::from_secs(2) && left > Duration::from_secs(1),
            "{left:?}"
        ),
        other => panic!("expected Taken with the time left, got {other:?}"),
    }
}

/// A grant's fence is drawn in the order grants on its key are made, even when the first
/// statement to draw one is held up between drawing it and writing its row: meanwhile a
/// second acquirer takes the key with a later fence and releases it, and the first, once it
/// goes on, must not be granted with its earlier, lower fence. The hold-up is a test
/// trigger that sleeps in the first insert of the key (after its `nextval`, before its row
/// is written), as a descheduled or paused backend would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_drawn_before_a_later_grant_is_never_granted_after_it() {
    let server = PostgresServer::start().await;
    let one = Arc::new(backend(&postgres_url(server.addr(), "table=ordered&timeout=10s")).await);
    let raw = server.client().await;
    let k = key("ordered");
    // Sleeps in the insert of the first acquirer's row only (its owner), taking no lock.
    let held_owner = Owner::random();
    raw.batch_execute(&format!(
        "CREATE FUNCTION hold_first_insert() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF NEW.owner = '{held_owner}' THEN PERFORM pg_sleep(1); END IF; \
           RETURN NEW; \
         END $$; \
         CREATE TRIGGER hold BEFORE INSERT ON ordered \
         FOR EACH ROW EXECUTE FUNCTION hold_first_insert()"
    ))
    .await
    .unwrap();
    let ttl = one
        .capabilities()
        .effective_ttl(Duration::from_secs(30))
        .unwrap();

    // The first acquirer draws its fence and is held up in the trigger.
    let first = {
        let (one, k) = (one.clone(), k.clone());
        tokio::spawn(async move {
            one.try_acquire(&k, held_owner, distlock::Permits::LOCK, ttl)
                .await
        })
    };
    let held_up = Instant::now();
    loop {
        let sleeping: i64 = raw
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if sleeping > 0 {
            break;
        }
        assert!(
            held_up.elapsed() < Duration::from_secs(10),
            "the trigger never ran"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Meanwhile a second acquirer (its own connection: another process) is granted, if it
    // can be, and releases.
    let second = backend(&postgres_url(server.addr(), "table=ordered&timeout=10s")).await;
    let mut fences = Vec::new();
    let owner = Owner::random();
    if let Attempt::Granted { fence, valid_until } = second
        .try_acquire(&k, owner, distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
    {
        fences.push(fence);
        second
            .release(&distlock::Lease::new(k.as_str(), owner, fence, valid_until))
            .await
            .unwrap();
    }
    if let Attempt::Granted { fence, .. } = first.await.unwrap().unwrap() {
        fences.push(fence);
    }
    assert!(!fences.is_empty(), "someone was granted the key");
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences in grant order must strictly increase: {fences:?}"
    );
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
    let Attempt::Granted { fence, .. } = backend
        .try_acquire(&k, owner, distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
    else {
        panic!("a free key is granted")
    };
    let first = expiry().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let Attempt::Granted { fence: again, .. } = backend
        .try_acquire(&k, owner, distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
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
