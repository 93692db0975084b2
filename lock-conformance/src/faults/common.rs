//! What the fault rules share: the answer of a rule that cannot run, and the bounds every
//! call must keep while a fault lasts.

use std::future::Future;
use std::time::{Duration, Instant};

use super::hooks::{Applied, Faults};
use crate::target::{opts, Target};
use lock_core::{Error, Locker, Result, WaitStrategy};

/// Says loudly that `rule` was not run on `t`, and why.
pub(super) fn not_run(t: &Target, rule: &str, why: impl Into<String>) -> Applied {
    let why = why.into();
    eprintln!(
        "conformance [{}]: fault rule {rule} NOT RUN: {why}",
        t.caps().name
    );
    Applied::NotRun(why)
}

/// The target's faults, or why `rule` cannot run.
pub(super) fn faults<'a>(t: &'a Target, rule: &str) -> std::result::Result<&'a Faults, Applied> {
    t.faults().ok_or_else(|| {
        not_run(
            t,
            rule,
            "the target has no fault hooks (Target::with_faults)",
        )
    })
}

/// Panics unless `e` says the servers cannot be reached: a transient `Unavailable` of this
/// backend, or a `QuorumNotReached` whose every node failed transiently.
pub(super) fn assert_unreachable(t: &Target, what: &str, e: &Error) {
    assert!(e.is_transient(), "{what}: not transient: {e}");
    match e {
        Error::Unavailable { backend, .. } => assert_eq!(*backend, t.caps().name, "{what}: {e}"),
        Error::QuorumNotReached {
            granted,
            needed,
            node_errors,
        } => {
            assert!(granted < needed, "{what}: {e}");
            assert!(
                node_errors.iter().all(Error::is_transient),
                "{what}: {node_errors:?}"
            );
        }
        other => panic!("{what}: expected Unavailable (or QuorumNotReached), got {other:?}"),
    }
}

/// Awaits `call`, which must fail as unreachable within `bound`.
pub(super) async fn fails_within<T: std::fmt::Debug>(
    t: &Target,
    what: &str,
    bound: Duration,
    call: impl Future<Output = Result<T>>,
) {
    let started = Instant::now();
    let result = call.await;
    let took = started.elapsed();
    match result {
        Ok(v) => panic!("{what}: succeeded with unreachable servers: {v:?}"),
        Err(e) => assert_unreachable(t, what, &e),
    }
    assert!(took <= bound, "{what} took {took:?}, bound {bound:?}");
}

/// With servers that cannot answer, `Skip` fails within the request timeout and
/// `Wait(500ms)` within its deadline (each plus the slack), both with a transient error;
/// `Skip`'s says the servers are unreachable.
pub(super) async fn acquires_fail_within_their_deadline(
    t: &Target,
    f: &Faults,
    locker: &Locker,
    key: &str,
) {
    let ttl = Duration::from_secs(1);
    fails_within(
        t,
        "acquire (Skip)",
        f.timeout + f.slack,
        locker.acquire(key, &opts(ttl).watchdog(false)),
    )
    .await;
    let wait = Duration::from_millis(500);
    let started = Instant::now();
    let result = locker
        .acquire(
            key,
            &opts(ttl).watchdog(false).wait(WaitStrategy::Wait(wait)),
        )
        .await;
    let waited = started.elapsed();
    let e = result.expect_err("nothing is granted without an answering server");
    assert!(e.is_transient(), "acquire (Wait): {e}");
    assert!(
        waited <= wait + f.slack,
        "acquire (Wait {wait:?}) returned after {waited:?}"
    );
}
