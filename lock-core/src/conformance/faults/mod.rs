//! Fault rules: what a lock does when its servers restart, die, freeze or drop off the
//! network. The faults themselves come from the test kit, as hooks in a [`Faults`] given to
//! [`Target::with_faults`]; a rule whose hook or capability is missing does not run and says
//! so on stderr and in its [`Applied`] answer, never passing silently. [`run_faults`] runs
//! them all and returns a [`FaultReport`] of the rules that did not run.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::target::{opts, BoxFuture, Target};
use crate::{Backend, Error, Locker, Result, WaitStrategy};

mod outage;
mod restart;

pub use outage::*;
pub use restart::*;

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
