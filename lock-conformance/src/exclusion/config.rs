//! What a run is told: its configuration ([`ExclusionConfig`]) and its faults ([`Fault`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::report::ViolationKind;
use crate::faults::hooks::BoxFuture;

pub(super) type Inject = Arc<dyn Fn() -> BoxFuture + Send + Sync>;
pub(super) type Probe = Arc<dyn Fn(Vec<String>) -> ProbeFuture + Send + Sync>;

/// Environment variable setting the checker's total duration in seconds.
pub const SOAK_ENV: &str = "DISTLOCK_SOAK_SECS";
/// Default total duration of a run, spread over its rounds.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(24);

/// A boxed future answering a keys-left probe: the lock keys still on the server.
pub type ProbeFuture = Pin<Box<dyn Future<Output = Vec<String>> + Send>>;

/// What a run does: its length, its shape and its seed.
#[derive(Clone, Debug)]
#[must_use = "setters return the changed value; it does nothing until used"]
pub struct ExclusionConfig {
    /// Total time of the rounds (the normal round and one per fault), split evenly;
    /// draining, settling and the final checks come on top.
    pub duration: Duration,
    /// Tasks per Locker, all working on the same few keys (so they queue on each other).
    pub tasks_per_locker: usize,
    /// Number of keys contended for.
    pub keys: usize,
    /// The seed; [`SEED_ENV`](super::SEED_ENV) overrides it; `None` draws one.
    pub seed: Option<u64>,
    /// TTLs are drawn log-uniformly from this range (rounded by the backend); `None`: from
    /// the backend's minimum (at least 100 ms) to 6× that (3× for whole-second backends).
    pub ttl_range: Option<(Duration, Duration)>,
    /// Prefix of the key names (default: `excl-<random>/`); the keys are
    /// [`key_names`](Self::key_names).
    pub prefix: String,
    /// What the tasks claim of the keys (default [`Grants::Locks`]).
    pub grants: Grants,
}

/// The kind of grant a run exercises: the resource then allows as many believers at once as
/// the kind does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Grants {
    /// Locks: one believer per key.
    #[default]
    Locks,
    /// A semaphore of this many permits per key: claims of 1 or 2 permits (1 when it has
    /// one), never more permits believed held than the key has.
    Permits(u32),
    /// Reader-writer keys: readers (most claims) share, a writer holds alone.
    ReaderWriter,
    /// Elections: each key is an election whose candidates campaign, sometimes proclaim a
    /// new value, and resign (release) or drop their leadership; one leader believes it
    /// leads at a time, a superseded term's write is refused, and an observer per Locker
    /// and key checks that the terms it is told never go back.
    Election,
}

impl Default for ExclusionConfig {
    fn default() -> Self {
        ExclusionConfig {
            duration: DEFAULT_DURATION,
            tasks_per_locker: 3,
            keys: 3,
            seed: None,
            ttl_range: None,
            prefix: format!("excl-{:08x}/", rand::random::<u32>()),
            grants: Grants::Locks,
        }
    }
}

impl ExclusionConfig {
    /// The defaults, with the duration from [`SOAK_ENV`] when set (the seed is read from
    /// [`SEED_ENV`](super::SEED_ENV) by [`Exclusion::run`](super::Exclusion::run) in any case).
    pub fn from_env() -> Self {
        let mut config = Self::default();
        if let Some(secs) = std::env::var(SOAK_ENV)
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
        {
            config.duration = Duration::from_secs_f64(secs);
        }
        config
    }

    /// Sets the total duration of the rounds.
    pub fn duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// Sets the seed (still overridden by [`SEED_ENV`](super::SEED_ENV)).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Sets the range TTLs are drawn from.
    pub fn ttl_range(mut self, min: Duration, max: Duration) -> Self {
        self.ttl_range = Some((min, max.max(min)));
        self
    }

    /// Sets the number of tasks per Locker.
    pub fn tasks_per_locker(mut self, tasks: usize) -> Self {
        self.tasks_per_locker = tasks.max(1);
        self
    }

    /// Sets the number of keys.
    pub fn keys(mut self, keys: usize) -> Self {
        self.keys = keys.max(1);
        self
    }

    /// Sets [`grants`](Self::grants): what the tasks claim.
    pub fn grants(mut self, grants: Grants) -> Self {
        self.grants = grants;
        self
    }

    /// Sets [`prefix`](Self::prefix).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The names of the keys the run contends for: `<prefix>k0`, `<prefix>k1`, ….
    pub fn key_names(&self) -> Vec<String> {
        (0..self.keys.max(1))
            .map(|i| format!("{}k{i}", self.prefix))
            .collect()
    }
}

/// A named fault, injected in the middle of a round of its own: the future does the whole
/// fault (e.g. pause the server, sleep past the longest TTL, resume it).
#[derive(Clone)]
pub struct Fault {
    pub(super) name: String,
    pub(super) inject: Inject,
    pub(super) allowed: Vec<(ViolationKind, &'static str)>,
}

impl fmt::Debug for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fault")
            .field("name", &self.name)
            .field("allowed", &self.allowed)
            .finish()
    }
}

impl Fault {
    /// A fault named `name`, done by the future `inject` returns.
    pub fn new<F, Fut>(name: impl Into<String>, inject: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Fault {
            name: name.into(),
            inject: Arc::new(move || Box::pin(inject())),
            allowed: Vec::new(),
        }
    }

    /// Declares violations of `kind` unavoidable by design from this fault's injection to
    /// the end of its round (e.g. a Redis restart without persistence can grant a key
    /// twice within a TTL): they are reported with `why` but do not fail the run. Every
    /// other kind stays checked.
    pub fn allow(mut self, kind: ViolationKind, why: &'static str) -> Self {
        self.allowed.push((kind, why));
        self
    }

    /// The fault's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}
