//! The rule of the fire-time claims ability ([`FireClaims`](lock_core::claims::FireClaims)).

use std::time::{Duration, SystemTime};

use super::target::{opts, Target};
use lock_core::claims::from_fire_millis;
use lock_core::Error;

/// Fire-time claims are won once per job and fire time: the first claim of a fire time
/// newer than the one kept wins, every other claim of it or of an older one is refused
/// with the claim kept; concurrent claims from several Lockers have exactly one winner;
/// the server's clock is answered; claims of one job leave other jobs and every lock
/// untouched; bad input is refused before any I/O. A backend without the ability refuses
/// with [`Error::Unsupported`].
pub async fn fire_time_claims_are_won_once(t: &Target) {
    let locker = t.locker();
    let job = t.key("claims/nächtlich 'x'; --");
    let f1 = from_fire_millis(1_800_000_000_000);
    if t.backend.fire_claims().is_none() {
        match locker.claim_fire_time(&job, f1, "a").await {
            Err(Error::Unsupported { .. }) => {}
            other => panic!("no fire_claims(): claims are refused, got {other:?}"),
        }
        eprintln!("conformance [{}]: keeps no fire-time claims", t.caps().name);
        return;
    }
    // The job's lock is held meanwhile: claims must not touch it.
    let guard = locker
        .acquire(&job, &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(
        locker.fire_claim(&job).await.unwrap(),
        None,
        "nothing claimed yet"
    );

    let before = SystemTime::now();
    let first = locker
        .claim_fire_time(&job, f1 + Duration::from_micros(700), "a")
        .await
        .unwrap();
    assert!(first.won, "{first:?}");
    assert_eq!(first.claim.fire_time, f1, "kept in whole milliseconds");
    assert_eq!(first.claim.replica, "a");
    if let Some(server) = first.server_time {
        let off = |a: SystemTime, b: SystemTime| a.duration_since(b).unwrap_or_default();
        assert!(
            off(before, server) < Duration::from_secs(60)
                && off(server, SystemTime::now()) < Duration::from_secs(60),
            "the server's clock on loopback is near ours: {server:?}"
        );
        assert!(first.claim.claimed_at.is_some(), "{first:?}");
    }
    for (fire, replica) in [(f1, "b"), (f1 - Duration::from_secs(1), "b"), (f1, "a")] {
        let again = locker.claim_fire_time(&job, fire, replica).await.unwrap();
        assert!(!again.won, "{fire:?} by {replica}: {again:?}");
        assert_eq!(again.claim.fire_time, f1);
        assert_eq!(again.claim.replica, "a", "the claim kept is answered");
    }
    assert_eq!(
        locker.fire_claim(&job).await.unwrap().map(|c| c.replica),
        Some("a".to_owned())
    );

    // Many claims of the next fire time at once, from several Lockers: one wins.
    let f2 = f1 + Duration::from_secs(10);
    let lockers: Vec<_> = (0..4).map(|_| t.locker()).collect();
    let claims = (0..16).map(|i| {
        let (locker, job) = (lockers[i % 4].clone(), job.clone());
        tokio::spawn(async move { locker.claim_fire_time(&job, f2, &format!("r{i}")).await })
    });
    let answers: Vec<_> = futures::future::join_all(claims)
        .await
        .into_iter()
        .map(|a| a.expect("the claim task").expect("the claim"))
        .collect();
    let winners: Vec<_> = answers.iter().filter(|a| a.won).collect();
    assert_eq!(winners.len(), 1, "exactly one winner: {answers:?}");
    let winner = &winners[0].claim.replica;
    assert!(
        answers
            .iter()
            .all(|a| a.claim.fire_time == f2 && &a.claim.replica == winner),
        "{answers:?}"
    );

    // Another job is untouched, and starts from nothing.
    let other = t.key("claims/other");
    let theirs = locker.claim_fire_time(&other, f1, "c").await.unwrap();
    assert!(theirs.won, "{theirs:?}");
    assert_eq!(
        locker.fire_claim(&job).await.unwrap().map(|c| c.fire_time),
        Some(f2)
    );

    // Bad input, before any I/O.
    for (job, fire, replica) in [
        ("", f1, "a"),
        (job.as_str(), f2 + Duration::from_secs(1), ""),
        (job.as_str(), f2 + Duration::from_secs(1), &"r".repeat(257)),
        (
            job.as_str(),
            SystemTime::UNIX_EPOCH - Duration::from_secs(1),
            "a",
        ),
    ] {
        match locker.claim_fire_time(job, fire, replica).await {
            Err(Error::InvalidKey { .. }) => {}
            other => panic!("{job:?} {fire:?} {replica:?}: refused, got {other:?}"),
        }
    }
    assert!(!guard.is_lost(), "claims leave the job's lock alone");
    guard.release().await.expect("the lock is still ours");
}

/// `Locker::run_scheduled` runs a fire time once across Lockers: of several asking for
/// the same fire time at once, one runs it (not before the fire time, with a margin for
/// the server's clock) and the others are told it was claimed elsewhere; its at-least hold
/// keeps the lock after a quick job. A backend without claims refuses.
pub async fn run_scheduled_runs_a_fire_time_once(t: &Target) {
    let job = t.key("claims/run-scheduled");
    let fire = SystemTime::now() + Duration::from_millis(300);
    let hold = (t.short_ttl() * 2).max(Duration::from_secs(2));
    let lockers: Vec<_> = (0..4).map(|_| t.locker()).collect();
    if t.backend.fire_claims().is_none() {
        let refused = lockers[0]
            .run_scheduled(&job, fire, "r0", &opts(hold), async {})
            .await;
        assert!(
            matches!(refused, Err(Error::Unsupported { .. })),
            "{refused:?}"
        );
        return;
    }
    let (ran, mut job_ran) = tokio::sync::mpsc::unbounded_channel::<()>();
    let runs: Vec<_> = lockers
        .iter()
        .enumerate()
        .map(|(i, locker)| {
            let (locker, job, ran) = (locker.clone(), job.clone(), ran.clone());
            let o = opts(Duration::from_secs(10)).at_least(hold);
            tokio::spawn(async move {
                locker
                    .run_scheduled(&job, fire, &format!("r{i}"), &o, async move {
                        let at = SystemTime::now();
                        let _ = ran.send(());
                        at
                    })
                    .await
            })
        })
        .collect();
    drop(ran);
    // The winner's job ends at once; its lock stays within the at-least hold (checked
    // while the hold has half a second or more to go: on a machine so loaded that the
    // run started later, the probe would find the hold over, rightly).
    if job_ran.recv().await.is_some()
        && SystemTime::now() + Duration::from_millis(500) < fire + hold
    {
        let probe = t.locker().try_acquire(&job).await.unwrap();
        assert!(
            probe.is_none(),
            "the job's lock is kept after a quick run, within its at-least hold"
        );
    }
    let outcomes: Vec<_> = futures::future::join_all(runs)
        .await
        .into_iter()
        .map(|o| o.expect("the task").expect("run_scheduled"))
        .collect();
    let started: Vec<SystemTime> = outcomes
        .iter()
        .filter_map(|o| match o {
            lock_core::Outcome::Ran(at) => Some(*at),
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), 1, "one run: {outcomes:?}");
    let elsewhere = outcomes
        .iter()
        .filter(|o| matches!(o, lock_core::Outcome::ClaimedElsewhere))
        .count();
    assert_eq!(elsewhere, 3, "{outcomes:?}");
    // The server's clock is near ours on loopback: never more than a second early.
    assert!(
        started[0] + Duration::from_secs(1) >= fire,
        "ran {:?} before the fire time",
        fire.duration_since(started[0]).unwrap_or_default()
    );
    // The same fire time again: claimed already.
    let again = lockers[0]
        .run_scheduled(&job, fire, "r0", &opts(hold), async {})
        .await
        .unwrap();
    assert!(
        matches!(again, lock_core::Outcome::ClaimedElsewhere),
        "{again:?}"
    );
}
