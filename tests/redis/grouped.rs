//! Grouped script calls: a foreign value in a group fails only its own caller; hand-overs
//! sent together are one call, each answered as alone.

use super::*;

/// Concurrent acquires grouped into one script call, one of them on a lock key holding a
/// foreign list (WRONGTYPE) and one whose holder asks again while its fence counter holds
/// a foreign list: each caller gets the answer it gets alone (the list key: its own
/// error; the holder: its grant; everyone else: a grant), and no caller that got an error
/// is left holding a lock (an error half-way through the script used to abort it after
/// the earlier grants of the group were written: orphaned locks nobody was told about).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_type_in_an_acquire_group_fails_only_its_own_caller() {
    let server = RedisServer::start().await;
    let node = node(&server, "wrongtype:").await;
    let ttl = valid_ttl(Duration::from_secs(10));
    let holder = Owner::random();
    assert!(matches!(
        node.try_acquire("wt/again", holder, ttl).await.unwrap(),
        distlock::Attempt::Granted { .. }
    ));
    raw_list(&server, &node.fence_key("wt/again")).await;
    raw_list(&server, &node.lock_key("wt/list")).await;
    let mut names: Vec<String> = (0..40).map(|i| format!("wt/{i}")).collect();
    names.insert(20, "wt/list".into());
    names.insert(30, "wt/again".into());
    let owners: Vec<Owner> = names
        .iter()
        .map(|n| {
            if n == "wt/again" {
                holder
            } else {
                Owner::random()
            }
        })
        .collect();
    let before = calls(&server, "evalsha").await;
    let attempts = futures::future::join_all(
        names
            .iter()
            .zip(&owners)
            .map(|(n, o)| node.try_acquire(n, *o, ttl)),
    )
    .await;
    let used = calls(&server, "evalsha").await - before;
    assert!(
        used < 20,
        "42 concurrent acquires took {used} calls: not grouped"
    );
    let mut failed = Vec::new();
    for ((name, owner), attempt) in names.iter().zip(&owners).zip(&attempts) {
        if attempt.is_err() {
            let left = raw_string(&server, &node.lock_key(name)).await;
            if left == Some(owner.to_string()) {
                failed.push(format!("{name} (its lock left behind)"));
            } else {
                failed.push(name.clone());
            }
        }
    }
    assert_eq!(
        failed,
        ["wt/list"],
        "only the caller on the foreign key fails: {attempts:?}"
    );
    for ((name, owner), attempt) in names.iter().zip(&owners).zip(attempts) {
        match attempt {
            Ok(distlock::Attempt::Granted { fence, .. }) => {
                assert!(fence > 0);
                assert_eq!(
                    raw_string(&server, &node.lock_key(name)).await,
                    Some(owner.to_string())
                );
            }
            Ok(taken) => panic!("{name}: {taken:?}"),
            Err(e) => {
                assert_eq!(name, "wt/list");
                assert!(matches!(e, Error::Backend { .. }), "{e:?}");
                assert!(e.report().to_string().contains("WRONGTYPE"), "{e}");
            }
        }
    }
    assert_eq!(raw_type(&server, &node.lock_key("wt/list")).await, "list");
}

/// Concurrent releases grouped into one script call, one of them of a lock key holding a
/// foreign list: that caller gets its own error, every other caller's lock is deleted
/// (an error half-way used to abort the script, leaving the later locks of the group in
/// place while their callers were told the release failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_type_in_a_release_group_fails_only_its_own_caller() {
    let server = RedisServer::start().await;
    let node = node(&server, "wrongtype:").await;
    let ttl = valid_ttl(Duration::from_secs(10));
    let mut names: Vec<String> = (0..40).map(|i| format!("wtr/{i}")).collect();
    let owners: Vec<Owner> = names.iter().map(|_| Owner::random()).collect();
    for (name, owner) in names.iter().zip(&owners) {
        assert!(matches!(
            node.try_acquire(name, *owner, ttl).await.unwrap(),
            distlock::Attempt::Granted { .. }
        ));
    }
    raw_list(&server, &node.lock_key("wtr/list")).await;
    names.insert(20, "wtr/list".into());
    let mut owners = owners;
    owners.insert(20, Owner::random());
    let before = calls(&server, "evalsha").await;
    let releases =
        futures::future::join_all(names.iter().zip(&owners).map(|(n, o)| node.release(n, *o)))
            .await;
    let used = calls(&server, "evalsha").await - before;
    assert!(
        used < 20,
        "41 concurrent releases took {used} calls: not grouped"
    );
    let mut left = Vec::new();
    for name in &names {
        if name != "wtr/list" && raw_exists(&server, &node.lock_key(name)).await {
            left.push(name.clone());
        }
    }
    assert!(left.is_empty(), "locks left after their release: {left:?}");
    for (name, released) in names.iter().zip(releases) {
        match released {
            Ok(true) => assert_ne!(name, "wtr/list"),
            Ok(false) => panic!("{name}: not held"),
            Err(e) => {
                assert_eq!(name, "wtr/list", "{e}");
                assert!(matches!(e, Error::Backend { .. }), "{e:?}");
                assert!(e.report().to_string().contains("WRONGTYPE"), "{e}");
            }
        }
    }
}

/// Hand-overs sent together are grouped into few script calls (a dropped guard's release
/// that hands the key to the next waiter, on many keys at once), and each caller gets the
/// answer it gets alone: a key its holder no longer holds stays with its holder (`Taken`),
/// a next owner whose attempt was abandoned is not handed the key, a hand-over asked again
/// after a lost reply answers the same fence, a lock key holding a foreign list is that
/// caller's own error, and every other key passes to its next owner with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_overs_sent_together_are_grouped_and_each_answered_alone() {
    let server = RedisServer::start().await;
    let node = node(&server, "handed:").await;
    let ttl = valid_ttl(Duration::from_secs(10));
    let names: Vec<String> = (0..40).map(|i| format!("ho/{i}")).collect();
    let (me, other, next) = (Owner::random(), Owner::random(), Owner::random());
    let mut fences = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let holder = if i < 5 { other } else { me };
        match node.try_acquire(name, holder, ttl).await.unwrap() {
            Attempt::Granted { fence, .. } => fences.push(fence),
            taken => panic!("{name}: {taken:?}"),
        }
    }
    // Key 5: the next owner's attempt there was abandoned. Key 6: handed over once already.
    let abandoned = Owner::random();
    assert!(!node.abandon(&names[5], abandoned).await.unwrap());
    let handed = match node.hand_over(&names[6], me, next, ttl).await.unwrap() {
        Attempt::Granted { fence, .. } => fence,
        taken => panic!("first hand-over: {taken:?}"),
    };
    assert!(handed > fences[6]);
    raw_list(&server, &node.lock_key(&names[7])).await;
    let to = |i: usize| if i == 5 { abandoned } else { next };

    let before = calls(&server, "evalsha").await;
    let answers = futures::future::join_all(
        names
            .iter()
            .enumerate()
            .map(|(i, name)| node.hand_over(name, me, to(i), ttl)),
    )
    .await;
    let used = calls(&server, "evalsha").await - before;
    assert!(
        used < 20,
        "40 concurrent hand-overs took {used} calls: not grouped"
    );
    for (i, answer) in answers.into_iter().enumerate() {
        let name = &names[i];
        let value = raw_string(&server, &node.lock_key(name)).await;
        match (i, answer) {
            (0..=4, Ok(Attempt::Taken { .. })) => {
                assert_eq!(value, Some(other.to_string()), "{name} stays its holder's")
            }
            (5, Ok(Attempt::Taken { .. })) => {
                assert_eq!(
                    value,
                    Some(me.to_string()),
                    "{name} not handed to an abandoned attempt"
                )
            }
            (6, Ok(Attempt::Granted { fence, .. })) => {
                assert_eq!(fence, handed, "{name}: asked again, the same fence");
                assert_eq!(value, Some(next.to_string()));
            }
            (7, Err(e)) => {
                assert!(matches!(e, Error::Backend { .. }), "{e:?}");
                assert!(e.report().to_string().contains("WRONGTYPE"), "{e}");
                assert_eq!(raw_type(&server, &node.lock_key(name)).await, "list");
            }
            (8.., Ok(Attempt::Granted { fence, .. })) => {
                assert!(
                    fence > fences[i],
                    "{name}: fence {fence} after {}",
                    fences[i]
                );
                assert_eq!(
                    value,
                    Some(next.to_string()),
                    "{name} passed to the next owner"
                );
            }
            (_, answer) => panic!("hand-over of {name}: {answer:?}"),
        }
    }
}
