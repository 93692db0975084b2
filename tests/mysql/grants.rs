//! Grants on the database's terms: expiry on its clock, a holder asking again, grouped
//! scripts under load.

use mysql_async::prelude::Queryable;

use super::*;

/// Expiry is the database's: a lease granted for 2 s expires 2 s after the database's
/// clock at the grant (as read by another session), and a second owner is told the
/// holder's time left by the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_is_measured_on_the_database_clock() {
    let server = MariaDbServer::start().await;
    let backend = backend(&mysql_url(server.addr(), "table=skew")).await;
    let mut raw = server.client().await;
    let k = key("skew");
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(2))
        .unwrap();
    let now = "SELECT CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)";
    let before: i64 = raw.query_first(now).await.unwrap().unwrap();
    let owner = Owner::random();
    let Attempt::Granted { fence, .. } = backend
        .try_acquire(&k, owner, distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
    else {
        panic!("a free key is granted")
    };
    let after: i64 = raw.query_first(now).await.unwrap().unwrap();
    let expires: i64 = raw
        .exec_first(
            "SELECT expires_us FROM skew WHERE lock_key = ?",
            (k.as_bytes(),),
        )
        .await
        .unwrap()
        .unwrap();
    assert!(
        expires >= before + 2_000_000 && expires <= after + 2_000_000,
        "expiry {expires} is the database's grant time + 2 s ({before}..{after})"
    );
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
    // The holder asking again (a request re-sent after a lost answer) keeps its fence.
    match backend
        .try_acquire(&k, owner, distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
    {
        Attempt::Granted { fence: again, .. } => assert_eq!(again, fence),
        other => panic!("the holder asking again is granted, got {other:?}"),
    }
    // The fences' table keeps no rows: each grant deletes the one it drew.
    let rows: i64 = raw
        .query_first("SELECT COUNT(*) FROM skew_fence")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rows, 0);
}

/// Many tasks of one Locker on distinct keys and on shared keys at once, so that
/// acquisitions, releases and hand-overs queue and go as grouped scripts: every task is
/// served, holders of one key never overlap, and each key's fences strictly increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_scripts_serve_every_task_in_order() {
    let server = MariaDbServer::start().await;
    let url = mysql_url(server.addr(), "table=grouped&timeout=5s");
    let lockers = [
        Locker::new(backend(&url).await),
        Locker::new(backend(&url).await),
    ];
    let prefix = key("grouped");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(30));
    let inside = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        String,
        (bool, u64),
    >::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..48 {
        let locker = lockers[t % 2].clone();
        let (opts, inside) = (opts.clone(), inside.clone());
        let prefix = prefix.clone();
        tasks.spawn(async move {
            for round in 0..6 {
                // A third of the tasks share 4 keys; the others have their own.
                let k = if t % 3 == 0 {
                    format!("{prefix}/shared-{}", (t + round) % 4)
                } else {
                    format!("{prefix}/own-{t}")
                };
                let guard = locker.acquire(&k, &opts).await.unwrap();
                {
                    let mut inside = inside.lock().unwrap();
                    let entry = inside.entry(k.clone()).or_insert((false, 0));
                    assert!(!entry.0, "two holders of {k}");
                    assert!(guard.fence() > entry.1, "fences of {k} go back");
                    *entry = (true, guard.fence());
                }
                tokio::task::yield_now().await;
                inside.lock().unwrap().get_mut(&k).unwrap().0 = false;
                if round % 2 == 0 {
                    guard.release().await.unwrap();
                } else {
                    drop(guard);
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    for locker in lockers {
        locker.shutdown().await;
    }
}

/// A grant's fence is drawn in the order grants on its key are made, even when the first
/// script to draw one is held up between drawing it and writing its row: the key's row
/// lock, taken before the fence is drawn, keeps a second acquirer waiting until the first
/// commits, so it never takes the key with a later fence meanwhile (and the first is never
/// then granted with its earlier, lower one). The hold-up is a test trigger that sleeps in
/// the first acquirer's update (after its fence was drawn), as a descheduled or paused
/// server thread would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_drawn_before_a_later_grant_is_never_granted_after_it() {
    let server = MariaDbServer::start().await;
    let url = mysql_url(server.addr(), "table=ordered&timeout=10s");
    let one = Arc::new(backend(&url).await);
    let two = backend(&url).await;
    let mut raw = server.client().await;
    let k = key("ordered");
    let held = Owner::random();
    raw.query_drop(format!(
        "CREATE TRIGGER hold_first BEFORE UPDATE ON ordered FOR EACH ROW \
         IF NEW.owner = '{held}' AND OLD.owner <> NEW.owner THEN DO SLEEP(1); END IF"
    ))
    .await
    .unwrap();
    let ttl = one
        .capabilities()
        .effective_ttl(Duration::from_secs(10))
        .unwrap();
    let first = tokio::spawn({
        let (one, k) = (one.clone(), k.clone());
        async move {
            one.try_acquire(&k, held, distlock::Permits::LOCK, ttl)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let second = two
        .try_acquire(&k, Owner::random(), distlock::Permits::LOCK, ttl)
        .await
        .unwrap();
    assert!(
        matches!(second, Attempt::Taken { .. }),
        "the second acquirer waited for the first one's row and found it held: {second:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(400), "it waited");
    let Attempt::Granted {
        fence: first_fence, ..
    } = first.await.unwrap().unwrap()
    else {
        panic!("the first acquirer is granted")
    };
    one.release(&distlock::Lease::new(
        k.as_str(),
        held,
        first_fence,
        Instant::now(),
    ))
    .await
    .unwrap();
    match two
        .try_acquire(&k, Owner::random(), distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
    {
        Attempt::Granted { fence, .. } => assert!(fence > first_fence, "{fence} > {first_fence}"),
        other => panic!("the key is free again: {other:?}"),
    }
}

/// An attempt that meets an InnoDB deadlock is one attempt: the server rolled its script
/// back, and the backend answers the transient `Unavailable` at once (naming the deadlock)
/// instead of sending the script again; the Locker's waiting policy is what tries again,
/// and grants the key once the other transaction has ended. The deadlock: another session
/// (heavier, so InnoDB rolls the backend's script back) holds a row that a test trigger
/// makes the acquisition ask for after it locked its key's row, then asks for that key's
/// row itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_meets_a_deadlock_fails_transiently_at_once() {
    let server = MariaDbServer::start().await;
    let timeout = Duration::from_secs(5);
    let url = mysql_url(server.addr(), "table=deadlocked&timeout=5s");
    let locker = Locker::new(backend(&url).await);
    let (mut other, mut watch) = (server.client().await, server.client().await);
    let k = key("deadlocked");
    let held = Owner::random();
    let ttl = locker
        .capabilities()
        .effective_ttl(Duration::from_secs(5))
        .unwrap();
    block_after_the_row(
        &mut other,
        "deadlocked",
        "BEFORE UPDATE",
        &format!("NEW.owner = '{held}'"),
    )
    .await;
    let started = Instant::now();
    let attempt = locker
        .backend()
        .try_acquire(&k, held, distlock::Permits::LOCK, ttl);
    let cycle = async {
        // The acquisition holds its key's row and waits for the blocker's.
        lock_wait(&mut watch, started + timeout).await;
        other
            .query_drop(format!(
                "UPDATE deadlocked SET fence = fence WHERE lock_key = {}",
                hex_literal(k.as_bytes())
            ))
            .await
    };
    let (attempt, cycle) =
        tokio::time::timeout(timeout * 2, async { tokio::join!(attempt, cycle) })
            .await
            .expect("the attempt and the other session end");
    let elapsed = started.elapsed();
    cycle.expect("the heavier session survives the deadlock");
    let err = attempt.expect_err("the deadlocked attempt fails");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_transient());
    let report = err.report().to_string();
    assert!(report.contains("error 1213"), "{report}");
    assert!(
        elapsed < timeout / 2,
        "answered at once, not sent again until the timeout: {elapsed:?}"
    );
    other.query_drop("ROLLBACK").await.unwrap();
    let guard = locker
        .acquire(&k, &LockOptions::new().ttl(ttl.get()).wait_for(timeout))
        .await
        .expect("the Locker grants the key once the other transaction ended");
    guard.release().await.unwrap();
    locker.shutdown().await;
}

/// A release that meets an InnoDB deadlock is sent again: the server rolled its script back
/// whole (nothing of it happened, "try restarting transaction"), and nothing above a
/// release tries again (the bench's 64 tasks met it in every round: `release()` failed
/// and the lock stayed until its TTL). The deadlock: another session (heavier, so InnoDB
/// rolls the release back) holds a row that a test trigger makes the release's `DELETE` ask
/// for after it locked the key's row, then asks for the key's row itself; once that session
/// ends, the release sent again deletes the row and answers `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_rolled_back_by_a_deadlock_is_sent_again() {
    let server = MariaDbServer::start().await;
    let timeout = Duration::from_secs(5);
    let url = mysql_url(server.addr(), "table=unlocked&timeout=5s");
    let backend = backend(&url).await;
    let (mut other, mut watch) = (server.client().await, server.client().await);
    let k = key("unlocked");
    let held = Owner::random();
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(10))
        .unwrap();
    let Attempt::Granted { fence, .. } = backend
        .try_acquire(&k, held, distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
    else {
        panic!("a free key is granted")
    };
    block_after_the_row(
        &mut other,
        "unlocked",
        "BEFORE DELETE",
        &format!("OLD.owner = '{held}'"),
    )
    .await;
    let started = Instant::now();
    let lease = distlock::Lease::new(k.as_str(), held, fence, Instant::now() + ttl.get());
    let release = backend.release(&lease);
    let cycle = async {
        // The release holds the key's row and waits for the blocker's.
        lock_wait(&mut watch, started + timeout).await;
        other
            .query_drop(format!(
                "UPDATE unlocked SET fence = fence WHERE lock_key = {}",
                hex_literal(k.as_bytes())
            ))
            .await
            .expect("the heavier session survives the deadlock");
        // The release, sent again, waits for the key's row this session now holds.
        tokio::time::sleep(Duration::from_millis(300)).await;
        other.query_drop("ROLLBACK").await
    };
    let (released, cycle) =
        tokio::time::timeout(timeout * 2, async { tokio::join!(release, cycle) })
            .await
            .expect("the release and the other session end");
    cycle.unwrap();
    released.expect("the release rolled back by the deadlock is sent again and succeeds");
    let left: Option<i64> = watch
        .exec_first(
            "SELECT fence FROM unlocked WHERE lock_key = ?",
            (k.as_bytes(),),
        )
        .await
        .unwrap();
    assert_eq!(left, None, "the row is deleted");
}

/// Sets up a deadlock for the backend's next script on `table`: a blocker table, a trigger
/// (`when`, on the row matching `condition`) that makes that script ask for the blocker's
/// row after it locked its key's row, and an open transaction of `other` holding that
/// blocker row, made heavier (500 rows written) so that InnoDB rolls the script back
/// rather than `other`.
async fn block_after_the_row(
    other: &mut mysql_async::Conn,
    table: &str,
    when: &str,
    condition: &str,
) {
    other
        .query_drop(format!(
            "CREATE TABLE {table}_blocker (id INT PRIMARY KEY) ENGINE = InnoDB; \
             INSERT INTO {table}_blocker VALUES (0); \
             CREATE TRIGGER {table}_after_the_row {when} ON {table} FOR EACH ROW \
             IF {condition} THEN UPDATE {table}_blocker SET id = id WHERE id = 0; END IF"
        ))
        .await
        .unwrap();
    let weight: Vec<String> = (1..=500).map(|i| format!("({i})")).collect();
    other
        .query_drop(format!(
            "START TRANSACTION; INSERT INTO {table}_blocker (id) VALUES {}; \
             UPDATE {table}_blocker SET id = id WHERE id = 0",
            weight.join(", ")
        ))
        .await
        .unwrap();
}

/// Until a transaction waits for a row lock (the server refreshes this table at most every
/// 100 ms of not being read); panics at `deadline`.
async fn lock_wait(watch: &mut mysql_async::Conn, deadline: Instant) {
    let waiting = "SELECT COUNT(*) FROM information_schema.INNODB_TRX \
                   WHERE trx_state = 'LOCK WAIT'";
    while watch.query_first::<i64, _>(waiting).await.unwrap() < Some(1) {
        assert!(Instant::now() < deadline, "no transaction ever waited");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// `X'…'`: `key` as a MySQL hex literal.
fn hex_literal(key: &[u8]) -> String {
    let digits: String = key.iter().map(|b| format!("{b:02x}")).collect();
    format!("X'{digits}'")
}
