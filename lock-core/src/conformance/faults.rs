//! Fault rules: what a lock does when its servers restart, die, freeze or drop off the
//! network. The faults themselves come from the test kit, as hooks in a [`Faults`] given to
//! [`Target::with_faults`]; a rule whose hook or capability is missing does not run and says
//! so on stderr and in its [`Applied`] answer, never passing silently. [`run_faults`] runs
//! them all and returns a [`FaultReport`] of the rules that did not run.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::target::{opts, spawn_acquire, BoxFuture, Target};
use crate::{Backend, Error, LockGuard, Locker, Result, WaitStrategy};

/// An action of the test kit on the servers behind a [`Target`] (restart, kill, pause, …).
pub type FaultHook = Arc<dyn Fn() -> BoxFuture + Send + Sync>;

fn hook<F, Fut>(f: F) -> FaultHook
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move || Box::pin(f()))
}

/// The faults a test kit can inject into the servers behind a [`Target`], and the bounds
/// the rules hold the backend to meanwhile.
///
/// Each hook acts on every server the backend talks to (all the nodes of a quorum, the
/// member or members whose loss takes the service down); a paired hook (`resume` after
/// `pause`, …) undoes its fault and returns once the servers answer again.
#[derive(Clone)]
pub struct Faults {
    pub(crate) timeout: Duration,
    pub(crate) slack: Duration,
    pub(crate) peer: Option<Arc<dyn Backend>>,
    pub(crate) restart_losing_locks: Option<FaultHook>,
    pub(crate) restart_keeping_locks: Option<FaultHook>,
    pub(crate) kill: Option<(FaultHook, FaultHook)>,
    pub(crate) pause: Option<(FaultHook, FaultHook)>,
    pub(crate) blackhole: Option<(FaultHook, FaultHook)>,
}

impl Faults {
    /// No faults yet, for a backend whose every request gives up after `timeout` (the
    /// request timeout it was configured with); the bounds allow 250 ms of slack.
    pub fn new(timeout: Duration) -> Self {
        Faults {
            timeout,
            slack: Duration::from_millis(250),
            peer: None,
            restart_losing_locks: None,
            restart_keeping_locks: None,
            kill: None,
            pause: None,
            blackhole: None,
        }
    }

    /// Slack allowed on every time bound, for scheduling and round trips.
    pub fn slack(mut self, slack: Duration) -> Self {
        self.slack = slack;
        self
    }

    /// A second instance of the backend over the same servers, with its own connections:
    /// "another process" for the rules that need one.
    pub fn peer(mut self, backend: Arc<dyn Backend>) -> Self {
        self.peer = Some(backend);
        self
    }

    /// Restarts the servers with an empty data set (no persistence): every lock is gone.
    pub fn restart_losing_locks<F, Fut>(mut self, restart: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.restart_losing_locks = Some(hook(restart));
        self
    }

    /// Restarts the servers with their data kept (persistence, etcd's log): the locks
    /// survive.
    pub fn restart_keeping_locks<F, Fut>(mut self, restart: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.restart_keeping_locks = Some(hook(restart));
        self
    }

    /// Kills the servers (`SIGKILL`: connections refused), and `revive` starts them again.
    pub fn kill<K, KF, R, RF>(mut self, kill: K, revive: R) -> Self
    where
        K: Fn() -> KF + Send + Sync + 'static,
        KF: Future<Output = ()> + Send + 'static,
        R: Fn() -> RF + Send + Sync + 'static,
        RF: Future<Output = ()> + Send + 'static,
    {
        self.kill = Some((hook(kill), hook(revive)));
        self
    }

    /// Freezes the servers (`SIGSTOP`: connections open, nothing answered), and `resume`
    /// continues them.
    pub fn pause<P, PF, R, RF>(mut self, pause: P, resume: R) -> Self
    where
        P: Fn() -> PF + Send + Sync + 'static,
        PF: Future<Output = ()> + Send + 'static,
        R: Fn() -> RF + Send + Sync + 'static,
        RF: Future<Output = ()> + Send + 'static,
    {
        self.pause = Some((hook(pause), hook(resume)));
        self
    }

    /// Blackholes the network between the backend and its servers (connections stay
    /// open, nothing gets through), and `heal` lets traffic pass again.
    pub fn blackhole<B, BF, H, HF>(mut self, cut: B, heal: H) -> Self
    where
        B: Fn() -> BF + Send + Sync + 'static,
        BF: Future<Output = ()> + Send + 'static,
        H: Fn() -> HF + Send + Sync + 'static,
        HF: Future<Output = ()> + Send + 'static,
    {
        self.blackhole = Some((hook(cut), hook(heal)));
        self
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("timeout", &self.timeout)
            .field("slack", &self.slack)
            .field("peer", &self.peer.is_some())
            .field("restart_losing_locks", &self.restart_losing_locks.is_some())
            .field(
                "restart_keeping_locks",
                &self.restart_keeping_locks.is_some(),
            )
            .field("kill", &self.kill.is_some())
            .field("pause", &self.pause.is_some())
            .field("blackhole", &self.blackhole.is_some())
            .finish()
    }
}

/// Whether a fault rule ran, or why it could not.
#[must_use = "a fault rule that did not run checked nothing"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The rule ran and held.
    Ran,
    /// The rule did not run: the target lacks the hook or the capability it needs.
    NotRun(String),
}

/// The outcome of [`run_faults`]: which rules did not run, and why.
#[must_use = "check which fault rules did not run"]
#[derive(Clone, Debug, Default)]
pub struct FaultReport {
    not_run: Vec<(&'static str, String)>,
}

impl FaultReport {
    /// The rules that did not run, in order, with the reason each gave.
    pub fn not_run(&self) -> &[(&'static str, String)] {
        &self.not_run
    }

    /// Panics unless exactly the rules named in `expected` did not run (every other rule
    /// ran), so that a lost hook cannot turn a rule off unnoticed.
    pub fn assert_not_run(&self, expected: &[&str]) {
        let names: Vec<&str> = self.not_run.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names, expected,
            "fault rules not run (with reasons): {:#?}",
            self.not_run
        );
    }
}

/// Says loudly that `rule` was not run on `t`, and why.
fn not_run(t: &Target, rule: &str, why: impl Into<String>) -> Applied {
    let why = why.into();
    eprintln!(
        "conformance [{}]: fault rule {rule} NOT RUN: {why}",
        t.caps().name
    );
    Applied::NotRun(why)
}

/// The target's faults, or why `rule` cannot run.
fn faults<'a>(t: &'a Target, rule: &str) -> std::result::Result<&'a Faults, Applied> {
    t.faults().ok_or_else(|| {
        not_run(
            t,
            rule,
            "the target has no fault hooks (Target::with_faults)",
        )
    })
}

/// Runs every fault rule on the target, in order, each bounded by a generous timeout so a
/// hang fails loudly with the rule's name; returns the rules that did not run.
pub async fn run_faults(t: &Target) -> FaultReport {
    let mut report = FaultReport::default();
    macro_rules! run {
        ($($rule:ident),* $(,)?) => {$(
            eprintln!("conformance [{}]: {}", t.caps().name, stringify!($rule));
            match tokio::time::timeout(Duration::from_secs(120), $rule(t)).await {
                Err(_) => panic!("conformance rule {} hung for 120 s", stringify!($rule)),
                Ok(Applied::Ran) => {}
                Ok(Applied::NotRun(why)) => report.not_run.push((stringify!($rule), why)),
            }
        )*};
    }
    run!(
        a_restart_that_loses_the_locks_leaves_holders_not_held,
        waiters_wake_after_a_restart_that_loses_the_locks,
        a_lock_survives_a_restart_that_keeps_the_locks,
        fences_increase_across_restarts,
        dead_servers_lose_the_holder_and_fail_every_call_fast,
        a_paused_server_bounds_every_call_and_loses_only_the_expired_holder,
        a_blackholed_network_bounds_every_call_and_loses_the_holder,
    );
    report
}

/// Panics unless `e` says the servers cannot be reached: a transient `Unavailable` of this
/// backend, or a `QuorumNotReached` whose every node failed transiently.
fn assert_unreachable(t: &Target, what: &str, e: &Error) {
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
async fn fails_within<T: std::fmt::Debug>(
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
async fn acquires_fail_within_their_deadline(t: &Target, f: &Faults, locker: &Locker, key: &str) {
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

/// After a restart that loses the locks, holders' extend and release say NotHeld (not a
/// script or connection error), inspect sees the key free, and new grants get higher fences.
pub async fn a_restart_that_loses_the_locks_leaves_holders_not_held(t: &Target) -> Applied {
    const RULE: &str = "a_restart_that_loses_the_locks_leaves_holders_not_held";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    let Some(restart) = f.restart_losing_locks.clone() else {
        return not_run(t, RULE, "no `restart_losing_locks` hook");
    };
    let locker = t.locker();
    let (key_a, key_b) = (t.key("restart-a"), t.key("restart-b"));
    let ttl = Duration::from_secs(10);
    let a = locker
        .acquire(&key_a, &opts(ttl).watchdog(false))
        .await
        .unwrap();
    let b = locker
        .acquire(&key_b, &opts(ttl).watchdog(false))
        .await
        .unwrap();
    let old_fence = a.fence();
    restart().await;
    // A server that forgot its locks may have forgotten its scripts too (Redis's cache):
    // the first use of each after the restart meets an empty cache.
    match a.extend(ttl).await {
        Err(Error::NotHeld { key }) => assert_eq!(key, key_a),
        other => panic!("extend after a restart: expected NotHeld, got {other:?}"),
    }
    assert!(a.is_lost());
    match b.release().await {
        Err(Error::NotHeld { key }) => assert_eq!(key, key_b),
        other => panic!("release after a restart: expected NotHeld, got {other:?}"),
    }
    match t.backend.admin() {
        Some(admin) => {
            assert_eq!(admin.inspect(&key_a).await.unwrap(), None);
            assert!(!admin.force_release(&key_a).await.unwrap());
        }
        None => eprintln!(
            "conformance [{}]: {RULE}: no admin(), inspect not checked",
            t.caps().name
        ),
    }
    let again = locker
        .acquire(&key_a, &opts(ttl).watchdog(false))
        .await
        .expect("new acquires work after a restart");
    if t.caps().monotonic_fencing {
        assert!(
            again.fence() > old_fence,
            "{} after {old_fence}",
            again.fence()
        );
    }
    assert!(matches!(a.release().await, Err(Error::NotHeld { .. })));
    again.release().await.unwrap();
    Applied::Ran
}

/// A waiter in another process whose holder vanished in a restart that loses the locks is
/// granted within 5 s of the restart (its release notices come back), long before the
/// holder's 30 s TTL.
pub async fn waiters_wake_after_a_restart_that_loses_the_locks(t: &Target) -> Applied {
    const RULE: &str = "waiters_wake_after_a_restart_that_loses_the_locks";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    let Some(restart) = f.restart_losing_locks.clone() else {
        return not_run(t, RULE, "no `restart_losing_locks` hook");
    };
    if !t.caps().release_notices {
        return not_run(
            t,
            RULE,
            "the backend announces no releases (release_notices)",
        );
    }
    let Some(peer) = f.peer.clone() else {
        return not_run(t, RULE, "no `peer` backend to wait in another process");
    };
    let (a, b) = (t.locker(), Locker::with_backend(peer));
    let key = t.key("resubscribe");
    let ttl = Duration::from_secs(30);
    let _held = a.acquire(&key, &opts(ttl).watchdog(false)).await.unwrap();
    let waiter = spawn_acquire(
        &b,
        &key,
        &opts(ttl).watchdog(false).wait_for(Duration::from_secs(20)),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restarted = Instant::now();
    restart().await;
    let g = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is woken after its release notices come back")
        .unwrap()
        .expect("and gets the lock");
    assert!(restarted.elapsed() < Duration::from_secs(5));
    g.release().await.unwrap();
    Applied::Ran
}

/// A renewing holder keeps its lock across a restart that keeps the locks (same fence,
/// others refused), and its release then reaches a waiter in another process promptly.
pub async fn a_lock_survives_a_restart_that_keeps_the_locks(t: &Target) -> Applied {
    const RULE: &str = "a_lock_survives_a_restart_that_keeps_the_locks";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    let Some(restart) = f.restart_keeping_locks.clone() else {
        return not_run(t, RULE, "no `restart_keeping_locks` hook");
    };
    let Some(peer) = f.peer.clone() else {
        return not_run(t, RULE, "no `peer` backend to wait in another process");
    };
    let (a, b) = (t.locker(), Locker::with_backend(peer));
    let key = t.key("survives");
    let ttl = t.ttl(Duration::from_secs(5)).get();
    let guard = a.acquire(&key, &opts(ttl)).await.unwrap();
    let fence = guard.fence();

    restart().await;
    // Two renewal periods after the restart: the watchdog found the lock again.
    tokio::time::sleep(ttl * 2 / 3).await;
    assert!(!guard.is_lost(), "the lock survives the restart");
    assert_eq!(guard.fence(), fence);
    assert!(b.try_acquire(&key).await.unwrap().is_none(), "still held");

    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let g = b
                .acquire(&key, &opts(ttl).wait_for(Duration::from_secs(10)))
                .await;
            (Instant::now(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    guard.release().await.expect("released after the restart");
    let (granted_at, g) = waiter.await.unwrap();
    let g = g.expect("the waiter gets the lock");
    if t.caps().monotonic_fencing {
        assert!(g.fence() > fence, "{} after {fence}", g.fence());
    }
    if t.caps().release_notices {
        let delay = granted_at - released_at;
        assert!(
            delay < Duration::from_millis(500),
            "hand-off after a restart took {delay:?}: the release notices must be back"
        );
    }
    g.release().await.unwrap();
    Applied::Ran
}

/// Fencing tokens keep strictly increasing across restarts of the servers, with the locks
/// lost or kept.
pub async fn fences_increase_across_restarts(t: &Target) -> Applied {
    const RULE: &str = "fences_increase_across_restarts";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    if !t.caps().monotonic_fencing {
        return not_run(t, RULE, "the backend promises no monotonic fencing");
    }
    let restarts: Vec<(&str, FaultHook)> = [
        ("restart_losing_locks", f.restart_losing_locks.clone()),
        ("restart_keeping_locks", f.restart_keeping_locks.clone()),
    ]
    .into_iter()
    .filter_map(|(name, hook)| Some((name, hook?)))
    .collect();
    if restarts.is_empty() {
        return not_run(t, RULE, "no restart hook");
    }
    let locker = t.locker();
    let key = t.key("restart-fence");
    let o = opts(Duration::from_secs(10)).watchdog(false);
    let mut fences = Vec::new();
    for (name, restart) in &restarts {
        for _ in 0..3 {
            for _ in 0..3 {
                let g = locker.acquire(&key, &o).await.unwrap();
                fences.push(g.fence());
                g.release().await.unwrap();
            }
            eprintln!("conformance [{}]: {RULE}: {name}", t.caps().name);
            restart().await;
        }
    }
    let g = locker
        .acquire(&key, &o)
        .await
        .expect("granted after the restarts");
    fences.push(g.fence());
    g.release().await.unwrap();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase across restarts: {fences:?}"
    );
    Applied::Ran
}

/// With the servers dead, a renewing holder's lost() fires within its TTL and every call
/// fails as unreachable within its bound; once they are back the same Locker works again.
pub async fn dead_servers_lose_the_holder_and_fail_every_call_fast(t: &Target) -> Applied {
    const RULE: &str = "dead_servers_lose_the_holder_and_fail_every_call_fast";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    let Some((kill, revive)) = f.kill.clone() else {
        return not_run(t, RULE, "no `kill` hook");
    };
    let locker = t.locker();
    let ttl = t.ttl(Duration::from_millis(600)).get();
    let long = Duration::from_secs(10);
    let renewing = locker
        .acquire(&t.key("killed-renewing"), &opts(ttl))
        .await
        .unwrap();
    let parked = locker
        .acquire(&t.key("killed-parked"), &opts(long).watchdog(false))
        .await
        .unwrap();
    let lost = renewing.lost();
    kill().await;
    let killed_at = Instant::now();
    tokio::time::timeout(ttl + f.slack, lost)
        .await
        .expect("lost() fires within the TTL after the servers died");
    assert!(killed_at.elapsed() <= ttl + f.slack);
    assert!(renewing.is_lost());

    let bound = f.timeout + f.slack;
    let other = t.key("killed-other");
    fails_within(
        t,
        "acquire",
        bound,
        locker.acquire(&other, &opts(ttl).watchdog(false)),
    )
    .await;
    fails_within(t, "extend", bound, parked.extend(long)).await;
    if let Some(admin) = t.backend.admin() {
        fails_within(t, "inspect", bound, admin.inspect(parked.key())).await;
        fails_within(t, "force_release", bound, admin.force_release(&other)).await;
    }
    let lease = parked.lease();
    fails_within(t, "release", bound, t.backend.release(&lease)).await;
    let wait = Duration::from_millis(500);
    fails_within(
        t,
        "acquire (Wait)",
        wait + f.slack,
        locker.acquire(&other, &opts(ttl).watchdog(false).wait_for(wait)),
    )
    .await;

    revive().await;
    let g = locker
        .acquire(
            &other,
            &opts(ttl).watchdog(false).wait_for(Duration::from_secs(2)),
        )
        .await
        .expect("the Locker reconnects after the servers are back");
    g.release().await.unwrap();
    drop((renewing, parked));
    Applied::Ran
}

/// With the servers paused every call fails transiently within its bound, a renewing
/// holder is lost by its validity and nobody else is granted its key meanwhile; after the
/// resume a longer lock is still held and the lost key goes to the next with a higher fence.
pub async fn a_paused_server_bounds_every_call_and_loses_only_the_expired_holder(
    t: &Target,
) -> Applied {
    const RULE: &str = "a_paused_server_bounds_every_call_and_loses_only_the_expired_holder";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    let Some((pause, resume)) = f.pause.clone() else {
        return not_run(t, RULE, "no `pause` hook");
    };
    let (locker, other) = (t.locker(), t.locker());
    let held = locker
        .acquire(
            &t.key("paused-held"),
            &opts(Duration::from_secs(30)).watchdog(false),
        )
        .await
        .unwrap();
    let ttl = t.ttl(Duration::from_millis(600)).get();
    let short_key = t.key("paused-short");
    let short = locker.acquire(&short_key, &opts(ttl)).await.unwrap();
    let lost = short.lost();
    pause().await;
    let paused_at = Instant::now();
    tokio::time::timeout(ttl + f.slack, lost)
        .await
        .expect("lost() fires within the TTL while the servers are paused");
    assert!(short.valid_until() <= paused_at + ttl);

    acquires_fail_within_their_deadline(t, f, &locker, &t.key("paused-a")).await;
    let taken = other.acquire(&short_key, &opts(ttl).watchdog(false)).await;
    assert!(
        taken.as_ref().is_err_and(Error::is_transient),
        "nobody is granted the lost holder's key while the servers are paused: {taken:?}"
    );
    if let Some(admin) = t.backend.admin() {
        let started = Instant::now();
        assert!(admin.inspect(held.key()).await.is_err());
        assert!(started.elapsed() <= f.timeout + f.slack);
    }
    resume().await;
    let g = locker
        .acquire(
            &t.key("paused-b"),
            &opts(Duration::from_secs(1)).watchdog(false),
        )
        .await
        .expect("works again after the servers resumed");
    g.release().await.unwrap();
    held.release()
        .await
        .expect("the lock held across the pause is still ours");
    let next = other
        .acquire(&short_key, &opts(ttl).wait_for(Duration::from_secs(5)))
        .await
        .expect("the lost holder's key is free after the resume");
    if t.caps().monotonic_fencing {
        assert!(next.fence() > short.fence());
    }
    next.release().await.unwrap();
    assert!(matches!(short.release().await, Err(Error::NotHeld { .. })));
    Applied::Ran
}

/// Through a blackholed network every call fails transiently within its bound and the
/// holder's lost() fires within its TTL; once healed the Locker works again and the old
/// guard's release says NotHeld.
pub async fn a_blackholed_network_bounds_every_call_and_loses_the_holder(t: &Target) -> Applied {
    const RULE: &str = "a_blackholed_network_bounds_every_call_and_loses_the_holder";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    let Some((cut, heal)) = f.blackhole.clone() else {
        return not_run(t, RULE, "no `blackhole` hook");
    };
    let locker = t.locker();
    let ttl = t.ttl(Duration::from_millis(1500)).get();
    let key = t.key("blackhole-held");
    let guard: LockGuard = locker.acquire(&key, &opts(ttl)).await.unwrap();
    let lost = guard.lost();
    cut().await;
    let cut_at = Instant::now();
    acquires_fail_within_their_deadline(t, f, &locker, &t.key("blackhole-a")).await;
    tokio::time::timeout((ttl + f.slack).saturating_sub(cut_at.elapsed()), lost)
        .await
        .expect("lost() fires within the TTL when renewals cannot get through");
    assert!(
        guard.valid_until() <= cut_at + ttl,
        "never valid past the last renewal + TTL"
    );
    if let Some(admin) = t.backend.admin() {
        let started = Instant::now();
        assert!(admin.inspect(&key).await.is_err());
        assert!(admin.force_release(&t.key("blackhole-x")).await.is_err());
        assert!(started.elapsed() <= f.timeout * 2 + f.slack);
    }
    heal().await;
    let g = locker
        .acquire(
            &t.key("blackhole-b"),
            &opts(Duration::from_secs(1))
                .watchdog(false)
                .wait_for(Duration::from_secs(3)),
        )
        .await
        .expect("works again after the network healed");
    g.release().await.unwrap();
    assert!(matches!(guard.release().await, Err(Error::NotHeld { .. })));
    Applied::Ran
}
