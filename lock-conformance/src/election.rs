//! The rules of leader election ([`Election`](lock_core::Election)). A backend without
//! leaders' values ([`Backend::leader_values`](lock_core::Backend::leader_values) `None`)
//! must refuse an election with [`Error::Unsupported`]; the others keep every rule below.

use std::time::{Duration, Instant};

use super::target::{opts, slack, Target};
use lock_core::election::{Leader, MAX_LEADER_VALUE};
use lock_core::{Error, Leadership, LockOptions, Locker};

/// Whether the target offers elections; when it does not, checks that it refuses them.
fn elects(t: &Target) -> bool {
    if t.backend.leader_values().is_some() {
        return true;
    }
    match t.locker().election(&t.key("election-refused")) {
        Err(Error::Unsupported { backend, .. }) => assert_eq!(backend, t.caps().name),
        other => panic!("an election on a backend without leaders' values: {other:?}"),
    }
    false
}

/// A campaign that waits up to 10 s, with `ttl`.
fn campaign_opts(t: &Target, ttl: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(t.ttl(ttl).get())
        .wait_for(Duration::from_secs(10))
}

/// `locker`'s campaign in the election `name` for `value`, which must win.
async fn lead(locker: &Locker, name: &str, value: &str, opts: &LockOptions) -> Leadership {
    locker
        .election(name)
        .unwrap()
        .campaign(value, opts)
        .await
        .unwrap_or_else(|e| panic!("{value}'s campaign in {name}: {e}"))
}

async fn leader(locker: &Locker, name: &str) -> Option<Leader> {
    locker.election(name).unwrap().leader().await.unwrap()
}

/// One leader at a time: a second candidate is refused while the first leads; the leader
/// read is the one that campaigned, with its value and term; after a resignation nobody
/// leads, and the next leader's term is greater.
pub async fn one_leader_per_term(t: &Target) {
    if !elects(t) {
        return;
    }
    let (a, b) = (t.locker(), t.locker());
    let name = t.key("election-one");
    let ttl = Duration::from_secs(10);
    assert_eq!(leader(&a, &name).await, None, "nobody leads a new election");
    let first = lead(&a, &name, "a", &campaign_opts(t, ttl)).await;
    let seen = leader(&b, &name).await.expect("a leads");
    assert_eq!(seen.value, b"a");
    assert_eq!(seen.term, first.term());
    assert!(seen.expires_in.is_none_or(|left| left <= ttl));
    match b.election(&name).unwrap().campaign("b", &opts(ttl)).await {
        Err(Error::Locked { .. }) => {}
        other => panic!("a second candidate led beside the first: {other:?}"),
    }
    let term = first.term();
    first.resign().await.unwrap();
    assert_eq!(
        leader(&b, &name).await,
        None,
        "nobody leads after a resignation"
    );
    let second = lead(&b, &name, "b", &campaign_opts(t, ttl)).await;
    assert!(second.term() > term, "terms strictly increase");
    assert_eq!(
        leader(&a, &name).await.map(|l| l.value),
        Some(b"b".to_vec())
    );
    second.resign().await.unwrap();
}

/// `proclaim` replaces the leader's value and keeps its term; a value over the limit is
/// refused before any I/O; a lost leader's proclamation is refused with `NotHeld` and
/// changes nothing.
pub async fn proclaim_keeps_the_term(t: &Target) {
    if !elects(t) {
        return;
    }
    let (a, b) = (t.locker(), t.locker());
    let name = t.key("election-proclaim");
    let ttl = t.short_ttl();
    let opts = campaign_opts(t, ttl).watchdog(false);
    let mut leading = lead(&a, &name, "v1", &opts).await;
    leading.proclaim("v2").await.unwrap();
    let seen = leader(&b, &name).await.expect("a leads");
    assert_eq!(
        (seen.value.as_slice(), seen.term),
        (&b"v2"[..], leading.term())
    );
    assert_eq!(leading.value(), b"v2");
    let too_long = vec![b'x'; MAX_LEADER_VALUE + 1];
    assert!(matches!(
        leading.proclaim(too_long.clone()).await,
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        b.election(&name).unwrap().campaign(too_long, &opts).await,
        Err(Error::InvalidKey { .. })
    ));
    // Lost: the TTL passes without renewal, and another candidate leads.
    tokio::time::sleep(ttl + slack(t)).await;
    let next = lead(&b, &name, "b", &opts).await;
    assert!(next.term() > leading.term());
    assert!(leading.is_lost());
    assert!(matches!(
        leading.proclaim("late").await,
        Err(Error::NotHeld { .. })
    ));
    let seen = leader(&a, &name).await.expect("b leads");
    assert_eq!((seen.value.as_slice(), seen.term), (&b"b"[..], next.term()));
    next.resign().await.unwrap();
}

/// A resigning leader hands over without waiting for its TTL: a candidate of another
/// Locker waiting for the election leads well within the TTL.
pub async fn resign_hands_over_without_waiting_for_the_ttl(t: &Target) {
    if !elects(t) {
        return;
    }
    let (a, b) = (t.locker(), t.locker());
    let name = t.key("election-resign");
    let ttl = Duration::from_secs(30);
    let first = lead(&a, &name, "a", &campaign_opts(t, ttl)).await;
    let election = b.election(&name).unwrap();
    let opts = campaign_opts(t, ttl);
    let waiting = tokio::spawn(async move { election.campaign("b", &opts).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resigned = Instant::now();
    first.resign().await.unwrap();
    let next = waiting.await.unwrap().unwrap();
    assert!(
        resigned.elapsed() < Duration::from_secs(5),
        "the next leader waited {:?} after a resignation",
        resigned.elapsed()
    );
    next.resign().await.unwrap();
}

/// The next change `watch` observes, within 5 s (a notice's delay, not a TTL's).
async fn next(watch: &mut lock_core::LeaderWatch) -> Option<Leader> {
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("a change observed within 5 s of a notice")
        .expect("the observation")
}

/// A follower that never campaigns observes every change in order, woken by notices (a
/// 30 s TTL: none of the changes below could be seen at an expiry): a leader, its new
/// value, its resignation, the next leader; terms only grow.
pub async fn a_follower_observes_every_change_in_order(t: &Target) {
    if !elects(t) {
        return;
    }
    let (a, b, follower) = (t.locker(), t.locker(), t.locker());
    let name = t.key("election-observe");
    let ttl = Duration::from_secs(30);
    let mut watch = follower.election(&name).unwrap().observe();
    assert_eq!(
        next(&mut watch).await,
        None,
        "the first answer is the state now"
    );
    let mut leading = lead(&a, &name, "a1", &campaign_opts(t, ttl)).await;
    let seen = next(&mut watch).await.expect("a leads");
    assert_eq!(
        (seen.value.as_slice(), seen.term),
        (&b"a1"[..], leading.term())
    );
    leading.proclaim("a2").await.unwrap();
    let seen = next(&mut watch).await.expect("a still leads");
    assert_eq!(
        (seen.value.as_slice(), seen.term),
        (&b"a2"[..], leading.term())
    );
    let term = leading.term();
    leading.resign().await.unwrap();
    assert_eq!(next(&mut watch).await, None, "a resignation is observed");
    let second = lead(&b, &name, "b", &campaign_opts(t, ttl)).await;
    let seen = next(&mut watch).await.expect("b leads");
    assert_eq!(
        (seen.value.as_slice(), seen.term),
        (&b"b"[..], second.term())
    );
    assert!(seen.term > term);
    // A dropped leadership is announced too.
    drop(second);
    assert_eq!(
        next(&mut watch).await,
        None,
        "a dropped leadership is observed"
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// A leader that stops renewing (a paused process) loses leadership within its TTL: the
/// next candidate leads with a greater term, and a resource checking terms refuses the
/// old leader's late write.
pub async fn a_paused_leader_is_superseded_and_its_term_refused(t: &Target) {
    if !elects(t) {
        return;
    }
    let (a, b) = (t.locker(), t.locker());
    let name = t.key("election-paused");
    let ttl = t.short_ttl();
    let paused = a
        .election(&name)
        .unwrap()
        .campaign("a", &campaign_opts(t, ttl).watchdog(false))
        .await
        .unwrap();
    // The resource keeps the highest term it accepted and refuses lower ones.
    let mut highest = 0;
    let mut write = |term: u64| {
        if term < highest {
            return false;
        }
        highest = term;
        true
    };
    assert!(write(paused.term()));
    let started = Instant::now();
    let next = lead(&b, &name, "b", &campaign_opts(t, ttl)).await;
    assert!(
        started.elapsed() < ttl + Duration::from_secs(3),
        "the next leader waited {:?} for a TTL of {ttl:?}",
        started.elapsed()
    );
    assert!(
        paused.is_lost(),
        "the old leader knows it lost before the next leads"
    );
    assert!(next.term() > paused.term());
    assert!(write(next.term()));
    assert!(
        !write(paused.term()),
        "the superseded term's late write is refused"
    );
    next.resign().await.unwrap();
}
