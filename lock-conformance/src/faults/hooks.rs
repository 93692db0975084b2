//! The fault hooks a test kit gives the fault rules ([`Faults`]), and what the rules
//! answer ([`Applied`], [`FaultReport`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lock_core::Backend;

/// A boxed future, as returned by a [`Target`](crate::Target)'s hooks.
pub type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// An action of the test kit on the servers behind a [`Target`](crate::Target) (restart, kill, pause, …).
pub type FaultHook = Arc<dyn Fn() -> BoxFuture + Send + Sync>;

pub(crate) fn hook<F, Fut>(f: F) -> FaultHook
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move || Box::pin(f()))
}

/// The faults a test kit can inject into the servers behind a [`Target`](crate::Target), and the bounds
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

/// The outcome of [`run_faults`](crate::run_faults): which rules did not run, and why.
#[must_use = "check which fault rules did not run"]
#[derive(Clone, Debug, Default)]
pub struct FaultReport {
    pub(super) not_run: Vec<(&'static str, String)>,
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
