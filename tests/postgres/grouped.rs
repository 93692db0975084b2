//! Grouped statements: requests arriving together answered as if alone.

use super::*;

/// Acquisitions, hand-overs and releases that arrive together go as grouped statements
/// (far fewer transactions than requests), and each request gets the answer its own
/// statement would have had: a live foreign holder refuses (and is marked awaited), an
/// expired row is taken over with a new, higher fence, the holder asking again keeps its
/// fence, a free key is granted; a hand-over passes only what is still ours, with a higher
/// fence; a release of a key not held is `NotHeld` and leaves the holder's row, and a
/// grouped release announces itself by `NOTIFY` to a waiter in another process.
///
/// On one thread: the 40 calls all reach the group commit before any statement is sent
/// (on two workers a loaded machine could pause the polling thread while the other
/// worker sent and answered each call alone: 35 transactions for 40 releases, once).
#[tokio::test(flavor = "current_thread")]
async fn grouped_statements_answer_each_request_as_alone() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=grouped");
    let one = backend(&url).await;
    let raw = server.client().await;
    let ttl = one
        .capabilities()
        .effective_ttl(Duration::from_secs(30))
        .unwrap();
    let (me, other) = (Owner::random(), Owner::random());
    let keys: Vec<String> = (0..40).map(|i| key(&format!("grouped{i:02}"))).collect();
    raw.batch_execute("SELECT setval('grouped_fence', 5000)")
        .await
        .unwrap();
    // 0..5 held by another owner, 5..10 expired rows of another owner, 10..15 held by the
    // requester itself; the rest free.
    for (i, k) in keys.iter().enumerate().take(15) {
        let (owner, fence, offset) = match i {
            0..=4 => (other, 1000 + i as i64, "30 seconds"),
            5..=9 => (other, 2000 + i as i64, "-1 second"),
            _ => (me, 3000 + i as i64, "30 seconds"),
        };
        raw.execute(
            &format!(
                "INSERT INTO grouped (key, owner, fence, expires_at) \
                 VALUES ($1, $2, $3, clock_timestamp() + interval '{offset}')"
            ),
            &[&k.as_bytes(), &owner.to_string(), &fence],
        )
        .await
        .unwrap();
    }
    let xid = || async {
        raw.query_one("SELECT txid_current()", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };

    let before = xid().await;
    let answers = futures::future::join_all(
        keys.iter()
            .map(|k| one.try_acquire(k, me, distlock::Permits::LOCK, ttl)),
    )
    .await;
    let writes = xid().await - before - 1;
    assert!(
        writes <= 12,
        "40 acquisitions sent together took {writes} transactions: not grouped"
    );
    let mut granted = Vec::new();
    let mut fences = vec![0; keys.len()];
    for (i, answer) in answers.into_iter().enumerate() {
        let answer = answer.unwrap();
        if let Attempt::Granted { fence, .. } = answer {
            fences[i] = fence;
        }
        match (i, answer) {
            (0..=4, Attempt::Taken { expires_in }) => {
                let left = expires_in.expect("the holder's time left");
                assert!(
                    left > Duration::from_secs(20) && left <= Duration::from_secs(30),
                    "{left:?}"
                );
            }
            (10..=14, Attempt::Granted { fence, .. }) => {
                assert_eq!(
                    fence,
                    3000 + i as u64,
                    "the holder asking again keeps its fence"
                )
            }
            (5..=9 | 15.., Attempt::Granted { fence, .. }) => {
                assert!(
                    fence > 5000,
                    "key {i}: a new fence from the sequence, got {fence}"
                );
                granted.push(fence);
            }
            (i, answer) => panic!("key {i}: {answer:?}"),
        }
    }
    granted.sort_unstable();
    granted.dedup();
    assert_eq!(granted.len(), 30, "every new grant has its own fence");
    for (i, k) in keys.iter().enumerate() {
        let row = raw
            .query_one(
                "SELECT owner, awaited FROM grouped WHERE key = $1",
                &[&k.as_bytes()],
            )
            .await
            .unwrap();
        let (owner, awaited): (String, bool) = (row.get(0), row.get(1));
        let expected = if i < 5 { other } else { me };
        assert_eq!(owner, expected.to_string(), "key {i}");
        assert_eq!(awaited, i < 5, "key {i}: only the refused rows are awaited");
    }

    // Hand-overs sent together: every key still ours passes to `next` with a higher
    // fence; the other owner's keys stay theirs.
    let next = Owner::random();
    let protocol = one.hand_over().expect("postgres hands over");
    let leases: Vec<distlock::Lease> = keys
        .iter()
        .zip(&fences)
        .map(|(k, fence)| distlock::Lease::new(k.as_str(), me, *fence, Instant::now()))
        .collect();
    let before = xid().await;
    let answers =
        futures::future::join_all(leases.iter().map(|l| protocol.hand_over(l, next, ttl))).await;
    let writes = xid().await - before - 1;
    assert!(
        writes <= 12,
        "40 hand-overs sent together took {writes} transactions: not grouped"
    );
    for (i, answer) in answers.into_iter().enumerate() {
        match (i, answer.unwrap()) {
            (0..=4, Attempt::Taken { .. }) => {}
            (5.., Attempt::Granted { fence, .. }) => assert!(
                fence > fences[i],
                "key {i}: handed over with fence {fence} after {}",
                fences[i]
            ),
            (i, answer) => panic!("hand-over of key {i}: {answer:?}"),
        }
    }
    let me = next;

    // A waiter in another process on a key released in the group.
    let watched = keys[20].clone();
    let b = Locker::new(backend(&url).await);
    let waiter = {
        let (b, k) = (b.clone(), watched.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait_for(Duration::from_secs(25));
            let guard = b.acquire(&k, &opts).await.unwrap();
            (Instant::now(), guard)
        })
    };
    let marked = Instant::now();
    loop {
        let awaited: bool = raw
            .query_one(
                "SELECT awaited FROM grouped WHERE key = $1",
                &[&watched.as_bytes()],
            )
            .await
            .unwrap()
            .get(0);
        if awaited {
            break;
        }
        assert!(
            marked.elapsed() < Duration::from_secs(10),
            "the waiter never asked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let leases: Vec<distlock::Lease> = keys
        .iter()
        .map(|k| distlock::Lease::new(k.as_str(), me, 0, Instant::now()))
        .collect();
    let before = xid().await;
    let released = Instant::now();
    let answers = futures::future::join_all(leases.iter().map(|l| one.release(l))).await;
    let writes = xid().await - before - 1;
    assert!(
        writes <= 12,
        "40 releases sent together took {writes} transactions: not grouped"
    );
    for (i, answer) in answers.into_iter().enumerate() {
        match (i, answer) {
            (0..=4, Err(Error::NotHeld { .. })) | (5.., Ok(())) => {}
            (i, answer) => panic!("release of key {i}: {answer:?}"),
        }
    }
    let left: Vec<Vec<u8>> = raw
        .query("SELECT key FROM grouped ORDER BY key", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .filter(|k: &Vec<u8>| *k != watched.as_bytes())
        .collect();
    let mut foreign: Vec<Vec<u8>> = keys[..5].iter().map(|k| k.as_bytes().to_vec()).collect();
    foreign.sort();
    assert_eq!(
        left, foreign,
        "only the other owner's rows (and the waiter's) remain"
    );
    let (granted, guard) = waiter.await.unwrap();
    let after = granted.duration_since(released);
    assert!(
        after < Duration::from_secs(3),
        "the waiter was woken {after:?} after the grouped release (its TTL fallback is 30 s)"
    );
    guard.release().await.unwrap();
}
