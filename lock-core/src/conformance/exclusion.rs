//! The randomized exclusion checker: many Lockers (stand-ins for processes, each on its own
//! backend instance) × many tasks on a few keys, random TTLs, waits, cancellations,
//! extensions, holds past the TTL, [`Locker::run`] jobs and faults between rounds, against
//! one shared fenced resource that fails the run when the safety rules break.
//!
//! The rules checked:
//! - **exclusion** ([`ViolationKind::Overlap`]): two holders of one key never both believe
//!   they hold (`now < valid_until` and not lost) at the same instant;
//! - **fencing** ([`ViolationKind::StaleFence`], [`ViolationKind::DuplicateFence`]): with
//!   [`Capabilities::monotonic_fencing`], no holder that believes it holds carries a fence
//!   lower than one the resource already accepted, and no two grants share a fence;
//! - **run** ([`ViolationKind::RunOutcome`]): [`Locker::run`] reports what happened and
//!   never lets its job outlive the call, its hard timeout or (watchdog off) its lock;
//! - **no leaks** ([`ViolationKind::Leak`], [`ViolationKind::KeysLeft`]): after the run
//!   every Locker's [`stats`](Locker::stats) is all zeros (after `settle`, and after
//!   `shutdown`), and no lock is left on the server;
//! - **liveness** ([`ViolationKind::Hang`]): every task ends within a bound after its round.
//!
//! # How exclusion is detected without false positives
//!
//! A holder writes to the resource only while it believes it holds, sampled right before
//! the write (`t1`). Under the key's mutex (`t2`) it registers itself as an occupant and
//! evaluates the belief of every other occupant *at that instant*, through a shared handle
//! to that holder's guard. After leaving the mutex (`t3`) it samples its own guard again.
//! A violation is recorded only when the other believed at `t2`, the writer's validity
//! sampled at `t1` lies beyond `t2`, and the writer is still not lost at `t3` (lost is
//! never cleared, so it was not lost at `t2` either): both believed at `t2`.
//!
//! # Replay
//!
//! Every random choice comes from RNGs seeded from one seed, printed at the start and in
//! the report; [`SEED_ENV`] forces it. Timing still differs between runs, so a replay
//! draws the same schedule of operations, not the same interleaving.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo(lockers: Vec<lock_core::Locker>) {
//! use lock_core::conformance::exclusion::{Exclusion, ExclusionConfig};
//!
//! let report = Exclusion::new(lockers)
//!     .config(ExclusionConfig::from_env())
//!     .run()
//!     .await;
//! report.assert_clean();
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::BoxFuture;
use crate::notices::lock;
use crate::{Capabilities, Error, LockGuard, LockOptions, Locker, Outcome, WaitStrategy};

/// Environment variable forcing the checker's seed (decimal or `0x` hex).
pub const SEED_ENV: &str = "DISTLOCK_CHECK_SEED";
/// Environment variable setting the checker's total duration in seconds.
pub const SOAK_ENV: &str = "DISTLOCK_SOAK_SECS";
/// Default total duration of a run, spread over its rounds.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(24);
/// Violations kept in full per kind in a [`Report`]; the rest are only counted.
const KEEP_PER_KIND: usize = 50;

/// A boxed future answering a keys-left probe: the lock keys still on the server.
pub type ProbeFuture = Pin<Box<dyn Future<Output = Vec<String>> + Send>>;

/// What a run does: its length, its shape and its seed.
#[derive(Clone, Debug)]
pub struct ExclusionConfig {
    /// Total time of the rounds (the normal round and one per fault), split evenly;
    /// draining, settling and the final checks come on top.
    pub duration: Duration,
    /// Tasks per Locker, all working on the same few keys (so they queue on each other).
    pub tasks_per_locker: usize,
    /// Number of keys contended for.
    pub keys: usize,
    /// The seed; [`SEED_ENV`] overrides it; `None` draws one.
    pub seed: Option<u64>,
    /// TTLs are drawn log-uniformly from this range (rounded by the backend); `None`: from
    /// the backend's minimum (at least 100 ms) to 6× that (3× for whole-second backends).
    pub ttl_range: Option<(Duration, Duration)>,
    /// Prefix of the key names (default: `excl-<random>/`); the keys are
    /// [`key_names`](Self::key_names).
    pub prefix: String,
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
        }
    }
}

impl ExclusionConfig {
    /// The defaults, with the duration from [`SOAK_ENV`] when set (the seed is read from
    /// [`SEED_ENV`] by [`Exclusion::run`] in any case).
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

    /// Sets the seed (still overridden by [`SEED_ENV`]).
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

    /// Sets the prefix of the key names.
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

/// The kinds of broken rules a run reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ViolationKind {
    /// Two holders of one key both believed they held it at the same instant.
    Overlap,
    /// A holder that believed it held carried a fence lower than one already accepted.
    StaleFence,
    /// Two different grants of one key carried the same fence.
    DuplicateFence,
    /// `Locker::run` misreported its outcome or let its job run on.
    RunOutcome,
    /// A Locker's stats were not all zeros after settle or shutdown.
    Leak,
    /// Lock keys were left on the server after every Locker was shut down.
    KeysLeft,
    /// A task, a settle or a shutdown did not finish within its bound.
    Hang,
    /// An operation failed with an error that is neither transient nor expected.
    UnexpectedError,
}

/// One broken rule, with what the checker saw.
#[derive(Clone, Debug)]
pub struct Violation {
    /// Which rule.
    pub kind: ViolationKind,
    /// The phase (round) it was seen in: `normal`, a fault's name, or `final`.
    pub phase: String,
    /// The key's name (empty when not about one key).
    pub key: String,
    /// When it was seen, since the start of the run.
    pub at: Duration,
    /// What happened, with fences, holders and times.
    pub detail: String,
    /// Set when the phase's fault allows this kind (see [`Fault::allow`]): why.
    pub allowed_because: Option<&'static str>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:?}] phase {} at +{:.3}s",
            self.kind,
            self.phase,
            self.at.as_secs_f64()
        )?;
        if !self.key.is_empty() {
            write!(f, " key {}", self.key)?;
        }
        write!(f, ": {}", self.detail)?;
        if let Some(why) = self.allowed_because {
            write!(f, " (allowed in this phase: {why})")?;
        }
        Ok(())
    }
}

type Inject = Arc<dyn Fn() -> BoxFuture + Send + Sync>;

/// A named fault, injected in the middle of a round of its own: the future does the whole
/// fault (e.g. pause the server, sleep past the longest TTL, resume it).
#[derive(Clone)]
pub struct Fault {
    name: String,
    inject: Inject,
    allowed: Vec<(ViolationKind, &'static str)>,
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

/// Counts of what a run did, to show it exercised something.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// Iterations started.
    pub iterations: u64,
    /// Guards won by `acquire` (also when the acquire was to be cancelled).
    pub acquired: u64,
    /// Acquires refused: `Locked` (skip) or `Timeout` (wait).
    pub refused: u64,
    /// Acquires cut short by the checker's timeout around them.
    pub cancelled: u64,
    /// Transient errors (server unreachable, quorum not reached).
    pub transient: u64,
    /// Writes the resource accepted.
    pub writes: u64,
    /// Writes the resource refused for a lower fence.
    pub fence_refusals: u64,
    /// Write attempts skipped because the writer no longer believed it held.
    pub not_believing: u64,
    /// Possible overlaps that could not be confirmed (the writer's own belief ended
    /// meanwhile), so not reported.
    pub unconfirmed: u64,
    /// `extend` calls that succeeded / failed.
    pub extends: (u64, u64),
    /// Guards ended by `release().await` / by drop.
    pub ends: (u64, u64),
    /// `run` outcomes: ran, skipped, timed out, lock lost.
    pub runs: [u64; 4],
}

/// The result of a run: its seed, what it did, and the rules it found broken.
#[derive(Clone, Debug)]
pub struct Report {
    /// The backend's name.
    pub backend: &'static str,
    /// The seed (set [`SEED_ENV`] to it to replay).
    pub seed: u64,
    /// The phases run, in order.
    pub phases: Vec<String>,
    /// Rules broken (kept in full up to a cap per kind; see `dropped`).
    pub violations: Vec<Violation>,
    /// Violations the phase's fault allows, kept for the record.
    pub allowed: Vec<Violation>,
    /// Violations counted per kind, including those not kept in full.
    pub totals: BTreeMap<ViolationKind, u64>,
    /// Allowed violations counted per kind.
    pub allowed_totals: BTreeMap<ViolationKind, u64>,
    /// What the run did.
    pub counters: Counters,
    /// How long the whole run took.
    pub elapsed: Duration,
}

impl Report {
    /// Whether no rule was broken (allowed violations do not count).
    pub fn is_clean(&self) -> bool {
        self.totals.is_empty()
    }

    /// Panics with the whole report (seed first) when a rule was broken.
    pub fn assert_clean(&self) {
        if !self.is_clean() {
            panic!("exclusion checker FAILED\n{self}");
        }
    }

    /// The number of violations of `kind` (allowed ones not included).
    pub fn count(&self, kind: ViolationKind) -> u64 {
        self.totals.get(&kind).copied().unwrap_or(0)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "exclusion [{}]: seed {} (replay: {}={}), phases {:?}, {:.1}s",
            self.backend,
            self.seed,
            SEED_ENV,
            self.seed,
            self.phases,
            self.elapsed.as_secs_f64()
        )?;
        let c = &self.counters;
        writeln!(
            f,
            "  did: {} iterations, {} acquired, {} refused, {} cancelled, {} transient errors, \
             {} writes, {} fence refusals, {} not-believing skips, {} unconfirmed, extends \
             {}/{} ok/failed, ends {}/{} release/drop, runs {:?} ran/skipped/timed-out/lost",
            c.iterations,
            c.acquired,
            c.refused,
            c.cancelled,
            c.transient,
            c.writes,
            c.fence_refusals,
            c.not_believing,
            c.unconfirmed,
            c.extends.0,
            c.extends.1,
            c.ends.0,
            c.ends.1,
            c.runs
        )?;
        if self.is_clean() {
            writeln!(f, "  no violations")?;
        } else {
            writeln!(f, "  VIOLATIONS: {:?}", self.totals)?;
            for v in &self.violations {
                writeln!(f, "  - {v}")?;
            }
        }
        if !self.allowed.is_empty() {
            writeln!(f, "  allowed by design: {:?}", self.allowed_totals)?;
            for v in self.allowed.iter().take(10) {
                writeln!(f, "  ~ {v}")?;
            }
        }
        write!(f, "  seed {} ({}={})", self.seed, SEED_ENV, self.seed)
    }
}

type Probe = Arc<dyn Fn(Vec<String>) -> ProbeFuture + Send + Sync>;

/// The checker: Lockers, faults, a keys-left probe and a [`ExclusionConfig`]; [`run`]
/// runs it and returns a [`Report`].
///
/// Pass one Locker per "process", each over its **own** backend instance (its own
/// connections), all pointing at the same server(s). For the in-process memory backend,
/// which has no server, pass Lockers over one shared backend instead.
///
/// [`run`]: Exclusion::run
pub struct Exclusion {
    lockers: Vec<Locker>,
    config: ExclusionConfig,
    faults: Vec<Fault>,
    probe: Option<Probe>,
}

impl fmt::Debug for Exclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exclusion")
            .field("lockers", &self.lockers.len())
            .field("config", &self.config)
            .field("faults", &self.faults)
            .finish()
    }
}

impl Exclusion {
    /// A checker over `lockers` with the defaults of [`ExclusionConfig::from_env`], no
    /// faults, and the keys-left probe asking the first Locker's backend
    /// ([`Backend::inspect`](crate::Backend::inspect); skipped when unsupported).
    pub fn new(lockers: Vec<Locker>) -> Self {
        Exclusion {
            lockers,
            config: ExclusionConfig::from_env(),
            faults: Vec::new(),
            probe: None,
        }
    }

    /// Sets the configuration.
    pub fn config(mut self, config: ExclusionConfig) -> Self {
        self.config = config;
        self
    }

    /// Adds a fault: one more round, with the fault injected in its middle.
    pub fn fault(mut self, fault: Fault) -> Self {
        self.faults.push(fault);
        self
    }

    /// Sets the probe run after every Locker is shut down: given the names of the keys
    /// used, it returns the lock keys still on the server (each a violation).
    pub fn keys_left<F, Fut>(mut self, probe: F) -> Self
    where
        F: Fn(Vec<String>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<String>> + Send + 'static,
    {
        self.probe = Some(Arc::new(move |keys| Box::pin(probe(keys))));
        self
    }

    /// Runs the rounds (normal, then one per fault), shuts every Locker down, checks for
    /// leaks, and reports. Never panics on a broken rule: see [`Report::assert_clean`].
    ///
    /// # Panics
    /// When given no Locker.
    pub async fn run(self) -> Report {
        assert!(
            !self.lockers.is_empty(),
            "the exclusion checker needs at least one Locker"
        );
        let caps = self.lockers[0].capabilities().clone();
        let seed = resolve_seed(self.config.seed);
        let (ttl_min, ttl_max) = ttl_range(&caps, self.config.ttl_range);
        let keys: Vec<Arc<str>> = self.config.key_names().into_iter().map(Arc::from).collect();
        let mut phases = vec!["normal".to_owned()];
        phases.extend(self.faults.iter().map(|f| f.name.clone()));
        eprintln!(
            "exclusion [{}]: seed {seed} (replay: {SEED_ENV}={seed}); {} lockers × {} tasks on \
             {} keys; TTL {ttl_min:?}..{ttl_max:?}; {:?} over phases {phases:?}",
            caps.name,
            self.lockers.len(),
            self.config.tasks_per_locker,
            keys.len(),
            self.config.duration,
        );
        let state = Arc::new(State {
            start: Instant::now(),
            caps,
            ttl_min,
            ttl_max,
            keys: keys.clone(),
            resource: keys.iter().map(|_| Mutex::default()).collect(),
            phase: Mutex::new(Phase {
                name: "normal".into(),
                allowed: Vec::new(),
            }),
            found: Mutex::default(),
            counters: Mutex::default(),
            next_id: AtomicU64::new(1),
        });
        let round_len = self.config.duration / phases.len() as u32;
        // An iteration waits at most 2 × ttl_max, holds at most 3 × ttl_max, plus slack.
        let drain = ttl_max * 12 + Duration::from_secs(10);
        for (round, name) in phases.iter().enumerate() {
            {
                let mut phase = lock(&state.phase);
                phase.name = name.clone();
                phase.allowed.clear();
            }
            let fault = round.checked_sub(1).map(|i| self.faults[i].clone());
            let round_end = Instant::now() + round_len;
            let mut tasks = Vec::new();
            for (l, locker) in self.lockers.iter().enumerate() {
                for t in 0..self.config.tasks_per_locker {
                    let worker = Worker {
                        state: state.clone(),
                        locker: locker.clone(),
                        who: format!("L{l}/T{t}"),
                        rng: StdRng::seed_from_u64(mix(seed, round as u64, l as u64, t as u64)),
                        round_end,
                    };
                    tasks.push(tokio::spawn(worker.run()));
                }
            }
            if let Some(fault) = fault {
                tokio::time::sleep(round_len / 2).await;
                lock(&state.phase).allowed = fault.allowed.clone();
                eprintln!(
                    "exclusion [{}]: +{:.3}s injecting fault {}",
                    state.caps.name,
                    state.start.elapsed().as_secs_f64(),
                    fault.name
                );
                (fault.inject)().await;
                eprintln!(
                    "exclusion [{}]: +{:.3}s fault {} over",
                    state.caps.name,
                    state.start.elapsed().as_secs_f64(),
                    fault.name
                );
            }
            let bound = round_end.max(Instant::now()) + drain;
            for mut task in tasks {
                match tokio::time::timeout_at(bound.into(), &mut task).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => state.violation(
                        ViolationKind::UnexpectedError,
                        "",
                        format!("a checker task failed: {e}"),
                    ),
                    Err(_) => {
                        task.abort();
                        state.violation(
                            ViolationKind::Hang,
                            "",
                            format!("a task did not finish within {drain:?} after its round"),
                        );
                    }
                }
            }
            for (l, locker) in self.lockers.iter().enumerate() {
                if tokio::time::timeout(drain, locker.settle()).await.is_err() {
                    state.violation(
                        ViolationKind::Hang,
                        "",
                        format!("L{l}: settle() did not finish within {drain:?}"),
                    );
                }
                check_stats(
                    &state,
                    l,
                    locker,
                    "after the round's guards ended and settle()",
                );
            }
        }
        lock(&state.phase).name = "final".into();
        lock(&state.phase).allowed.clear();
        for (l, locker) in self.lockers.iter().enumerate() {
            if tokio::time::timeout(drain, locker.shutdown())
                .await
                .is_err()
            {
                state.violation(
                    ViolationKind::Hang,
                    "",
                    format!("L{l}: shutdown() did not finish within {drain:?}"),
                );
            }
            check_stats(&state, l, locker, "after shutdown()");
        }
        let names: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let left = match &self.probe {
            Some(probe) => probe(names).await,
            None => inspect_left(&self.lockers[0], &names).await,
        };
        for key in left {
            state.violation(
                ViolationKind::KeysLeft,
                &key,
                "a lock is left on the server after every Locker was shut down".into(),
            );
        }
        let found = std::mem::take(&mut *lock(&state.found));
        let report = Report {
            backend: state.caps.name,
            seed,
            phases,
            violations: found.violations,
            allowed: found.allowed,
            totals: found.totals,
            allowed_totals: found.allowed_totals,
            counters: lock(&state.counters).clone(),
            elapsed: state.start.elapsed(),
        };
        eprintln!("{report}");
        report
    }
}

/// The seed: [`SEED_ENV`], else `configured`, else a random one.
fn resolve_seed(configured: Option<u64>) -> u64 {
    if let Ok(s) = std::env::var(SEED_ENV) {
        let s = s.trim();
        let parsed = match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => s.parse().ok(),
        };
        match parsed {
            Some(seed) => return seed,
            None => eprintln!("exclusion: ignoring {SEED_ENV}={s:?}: not a u64"),
        }
    }
    configured.unwrap_or_else(rand::random)
}

/// The TTL range: configured, or from the backend's minimum.
fn ttl_range(
    caps: &Capabilities,
    configured: Option<(Duration, Duration)>,
) -> (Duration, Duration) {
    let round = |d: Duration| caps.effective_ttl(d).unwrap_or(caps.min_ttl.max(d));
    match configured {
        Some((a, b)) => (round(a), round(b.max(a))),
        None => {
            let min = round(caps.min_ttl.max(Duration::from_millis(100)));
            let max = if min >= Duration::from_secs(1) {
                min * 3
            } else {
                min * 6
            };
            (min, round(max))
        }
    }
}

/// One 64-bit seed per (run seed, round, locker, task): splitmix64 over the mix.
fn mix(seed: u64, round: u64, locker: u64, task: u64) -> u64 {
    let mut z = seed
        ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ locker.wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ task.wrapping_mul(0x1656_67B1_9E37_79F9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn check_stats(state: &State, l: usize, locker: &Locker, when: &str) {
    let stats = locker.stats();
    if stats.held != 0 || stats.queued_keys != 0 || stats.background_tasks != 0 {
        state.violation(
            ViolationKind::Leak,
            "",
            format!("L{l}: stats {when} are {stats:?}, not all zeros"),
        );
    }
}

/// The default keys-left probe: [`Backend::inspect`](crate::Backend::inspect) of every key.
async fn inspect_left(locker: &Locker, keys: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    for key in keys {
        match locker.backend().inspect(key).await {
            Ok(None) => {}
            Ok(Some(holder)) => left.push(format!("{key} ({holder:?})")),
            Err(Error::Unsupported { .. }) => {
                eprintln!("exclusion: the backend cannot inspect keys; keys-left check skipped");
                return left;
            }
            Err(e) => left.push(format!("{key} (inspect failed: {e})")),
        }
    }
    left
}

struct Phase {
    name: String,
    allowed: Vec<(ViolationKind, &'static str)>,
}

#[derive(Default)]
struct Found {
    violations: Vec<Violation>,
    allowed: Vec<Violation>,
    totals: BTreeMap<ViolationKind, u64>,
    allowed_totals: BTreeMap<ViolationKind, u64>,
}

/// How a holder's belief is read by others.
#[derive(Clone)]
enum Belief {
    /// A guard: `now < valid_until && !is_lost()`.
    Guard(Weak<LockGuard>),
    /// A `Locker::run` job, which cannot see its guard: alive (not dropped) and before a
    /// lower bound of its guard's validity.
    Job {
        alive: Arc<AtomicBool>,
        until: Instant,
    },
}

impl Belief {
    /// Whether it believes it holds now, and until when it is valid.
    fn sample(&self) -> (bool, Instant) {
        match self {
            Belief::Guard(guard) => match guard.upgrade() {
                Some(g) => {
                    let until = g.valid_until();
                    (!g.is_lost() && Instant::now() < until, until)
                }
                None => (false, Instant::now()),
            },
            Belief::Job { alive, until } => (
                alive.load(Ordering::SeqCst) && Instant::now() < *until,
                *until,
            ),
        }
    }

    /// Whether it is still not lost (for guards) / alive (for jobs).
    fn not_lost(&self) -> bool {
        match self {
            Belief::Guard(guard) => guard.upgrade().is_some_and(|g| !g.is_lost()),
            Belief::Job { alive, .. } => alive.load(Ordering::SeqCst),
        }
    }
}

struct Occupant {
    id: u64,
    who: String,
    fence: Option<u64>,
    since: Instant,
    belief: Belief,
}

#[derive(Default)]
struct KeyState {
    occupants: Vec<Occupant>,
    /// The highest fence accepted and the holder that wrote it.
    max_fence: Option<(u64, u64, String)>,
}

struct State {
    start: Instant,
    caps: Capabilities,
    ttl_min: Duration,
    ttl_max: Duration,
    keys: Vec<Arc<str>>,
    resource: Vec<Mutex<KeyState>>,
    phase: Mutex<Phase>,
    found: Mutex<Found>,
    counters: Mutex<Counters>,
    next_id: AtomicU64,
}

/// One hold's identity at the resource.
struct Holding {
    id: u64,
    who: String,
    key: usize,
    fence: Option<u64>,
    since: Instant,
    belief: Belief,
}

impl State {
    fn at(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.start).as_secs_f64()
    }

    fn count(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut lock(&self.counters));
    }

    fn violation(&self, kind: ViolationKind, key: &str, detail: String) {
        let phase = lock(&self.phase);
        let allowed_because = phase
            .allowed
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, why)| *why);
        let v = Violation {
            kind,
            phase: phase.name.clone(),
            key: key.to_owned(),
            at: self.start.elapsed(),
            detail,
            allowed_because,
        };
        drop(phase);
        let mut found = lock(&self.found);
        let found = &mut *found;
        let (list, totals) = match allowed_because {
            Some(_) => (&mut found.allowed, &mut found.allowed_totals),
            None => (&mut found.violations, &mut found.totals),
        };
        let n = totals.entry(kind).or_insert(0);
        *n += 1;
        if *n as usize <= KEEP_PER_KIND {
            if allowed_because.is_none() {
                eprintln!("exclusion [{}]: VIOLATION {v}", self.caps.name);
            }
            list.push(v);
        }
    }

    /// One write by `me` to the resource; false when `me` no longer believed it held.
    fn write(&self, me: &Holding) -> bool {
        let t1 = Instant::now();
        let (believes, valid1) = me.belief.sample();
        if !believes {
            self.count(|c| c.not_believing += 1);
            return false;
        }
        let key = &self.keys[me.key];
        let mut suspects = Vec::new();
        let (t2, fence_issue, accepted) = {
            let mut ks = lock(&self.resource[me.key]);
            let t2 = Instant::now();
            ks.occupants
                .retain(|o| o.id == me.id || o.belief.sample().0);
            for o in ks.occupants.iter().filter(|o| o.id != me.id) {
                let (other_believes, other_until) = o.belief.sample();
                if other_believes {
                    suspects.push((o.who.clone(), o.fence, o.since, other_until));
                }
            }
            if !ks.occupants.iter().any(|o| o.id == me.id) {
                ks.occupants.push(Occupant {
                    id: me.id,
                    who: me.who.clone(),
                    fence: me.fence,
                    since: me.since,
                    belief: me.belief.clone(),
                });
            }
            let mut fence_issue = None;
            let mut accepted = true;
            if let Some(f) = me.fence {
                match &ks.max_fence {
                    Some((max, _, who)) if f < *max => {
                        accepted = false;
                        fence_issue = Some((ViolationKind::StaleFence, *max, who.clone()));
                    }
                    Some((max, id, who)) if f == *max && *id != me.id => {
                        fence_issue = Some((ViolationKind::DuplicateFence, *max, who.clone()));
                    }
                    _ => ks.max_fence = Some((f, me.id, me.who.clone())),
                }
            }
            (t2, fence_issue, accepted)
        };
        let confirmed = valid1 > t2 && me.belief.not_lost();
        let t3 = Instant::now();
        self.count(|c| {
            if accepted {
                c.writes += 1;
            } else {
                c.fence_refusals += 1;
            }
        });
        let my_fence = me
            .fence
            .map_or_else(|| "none (a run job)".to_owned(), |f| f.to_string());
        if !suspects.is_empty() && !confirmed {
            self.count(|c| c.unconfirmed += 1);
        }
        if confirmed {
            for (who, fence, since, until) in suspects {
                let fence = fence.map_or_else(|| "none (a run job)".to_owned(), |f| f.to_string());
                self.violation(
                    ViolationKind::Overlap,
                    key,
                    format!(
                        "{} (fence {my_fence}, holding since +{:.3}s, valid {:?} past the \
                         check) wrote at +{:.3}s while {who} (fence {fence}, holding since \
                         +{:.3}s, valid {:?} past the check, not lost) also believed it held",
                        me.who,
                        self.at(me.since),
                        valid1.saturating_duration_since(t2),
                        self.at(t2),
                        self.at(since),
                        until.saturating_duration_since(t2),
                    ),
                );
            }
        }
        if let Some((kind, max, who)) = fence_issue {
            // Two grants sharing a fence break monotonicity whatever the writer believes;
            // a lower fence only matters from a writer that believed it held.
            let matters = kind == ViolationKind::DuplicateFence || confirmed;
            if self.caps.monotonic_fencing && matters {
                self.violation(
                    kind,
                    key,
                    format!(
                        "{} (fence {my_fence}, holding since +{:.3}s, believing at +{:.3}s..\
                         +{:.3}s) wrote after {who} had written with fence {max}",
                        me.who,
                        self.at(me.since),
                        self.at(t1),
                        self.at(t3),
                    ),
                );
            }
        }
        true
    }

    /// Removes `me` from its key's occupants (before its hold ends).
    fn leave(&self, me: &Holding) {
        lock(&self.resource[me.key])
            .occupants
            .retain(|o| o.id != me.id);
    }
}

struct Worker {
    state: Arc<State>,
    locker: Locker,
    who: String,
    rng: StdRng,
    round_end: Instant,
}

/// What an iteration does.
enum Step {
    Acquire,
    Cancelled(Duration),
    Run,
}

impl Worker {
    async fn run(mut self) {
        while Instant::now() < self.round_end {
            self.state.count(|c| c.iterations += 1);
            self.iteration().await;
        }
    }

    fn draw_ttl(&mut self) -> Duration {
        let (a, b) = (
            self.state.ttl_min.as_secs_f64(),
            self.state.ttl_max.as_secs_f64(),
        );
        let ttl = if b > a {
            (self.rng.gen_range(a.ln()..=b.ln())).exp()
        } else {
            a
        };
        let ttl = Duration::from_secs_f64(ttl);
        self.state
            .caps
            .effective_ttl(ttl)
            .unwrap_or(self.state.ttl_min)
    }

    fn upto(&mut self, max: Duration) -> Duration {
        max.mul_f64(self.rng.gen_range(0.0..=1.0))
    }

    async fn iteration(&mut self) {
        let key_idx = self.rng.gen_range(0..self.state.keys.len());
        let key = self.state.keys[key_idx].clone();
        let ttl = self.draw_ttl();
        let watchdog = self.rng.gen_bool(0.5);
        let ttl_max = self.state.ttl_max;
        let step = match self.rng.gen_range(0..10) {
            0..=5 => Step::Acquire,
            6 | 7 => Step::Cancelled(self.upto(ttl_max)),
            _ => Step::Run,
        };
        if let Step::Run = step {
            return self.run_job(key_idx, ttl, watchdog).await;
        }
        let wait = if self.rng.gen_bool(0.25) {
            WaitStrategy::Skip
        } else {
            WaitStrategy::Wait(self.upto(ttl_max * 2))
        };
        let opts = LockOptions::new().ttl(ttl).wait(wait).watchdog(watchdog);
        let result = match step {
            Step::Cancelled(after) => {
                match tokio::time::timeout(after, self.locker.acquire(&*key, &opts)).await {
                    Ok(result) => result,
                    Err(_) => {
                        self.state.count(|c| c.cancelled += 1);
                        return;
                    }
                }
            }
            _ => self.locker.acquire(&*key, &opts).await,
        };
        match result {
            Ok(guard) => {
                self.state.count(|c| c.acquired += 1);
                self.hold(key_idx, guard, ttl, watchdog).await;
            }
            Err(e) => self.acquire_failed(&key, e).await,
        }
    }

    async fn acquire_failed(&mut self, key: &str, e: Error) {
        match e {
            Error::Locked { .. } | Error::Timeout { .. } => {
                self.state.count(|c| c.refused += 1);
            }
            e if e.is_transient() => {
                self.state.count(|c| c.transient += 1);
                // Do not spin on an unreachable server.
                let pause = self.upto(self.state.ttl_min);
                tokio::time::sleep(pause).await;
            }
            e => self.state.violation(
                ViolationKind::UnexpectedError,
                key,
                format!(
                    "{}: acquire failed with a non-transient error: {e}",
                    self.who
                ),
            ),
        }
    }

    /// Holds `guard` for a random time, writing several times and maybe extending, then
    /// ends it by release or by drop.
    async fn hold(&mut self, key: usize, guard: LockGuard, ttl: Duration, watchdog: bool) {
        let guard = Arc::new(guard);
        let me = Holding {
            id: self.state.next_id.fetch_add(1, Ordering::SeqCst),
            who: format!(
                "{} [ttl {:?}, watchdog {}]",
                self.who,
                guard.ttl(),
                if watchdog { "on" } else { "off" }
            ),
            key,
            fence: Some(guard.fence()),
            since: Instant::now(),
            belief: Belief::Guard(Arc::downgrade(&guard)),
        };
        let hold = match (watchdog, self.rng.gen_range(0..10)) {
            // Past the TTL with the watchdog off: the writes must stop at the validity.
            (false, 0..=2) => ttl.mul_f64(self.rng.gen_range(1.2..2.0)),
            // Across several renewals.
            (true, 0..=2) => ttl.mul_f64(self.rng.gen_range(1.0..3.0)),
            _ => ttl.mul_f64(self.rng.gen_range(0.0..0.9)),
        };
        let writes = self.rng.gen_range(2..=5u32);
        let gap = hold / writes;
        self.state.write(&me);
        for _ in 1..writes {
            tokio::time::sleep(gap).await;
            if self.rng.gen_bool(0.15) && !guard.is_lost() {
                let new_ttl = self.draw_ttl();
                match guard.extend(new_ttl).await {
                    Ok(()) => self.state.count(|c| c.extends.0 += 1),
                    Err(e) => {
                        self.state.count(|c| c.extends.1 += 1);
                        if !e.is_transient() && !matches!(e, Error::NotHeld { .. }) {
                            self.state.violation(
                                ViolationKind::UnexpectedError,
                                &self.state.keys[key],
                                format!("{}: extend failed with {e}", self.who),
                            );
                        }
                    }
                }
            }
            if !self.state.write(&me) {
                break;
            }
        }
        self.state.leave(&me);
        let by_release = self.rng.gen_bool(0.5);
        match Arc::try_unwrap(guard) {
            Ok(guard) if by_release => {
                self.state.count(|c| c.ends.0 += 1);
                match guard.release().await {
                    Ok(()) | Err(Error::NotHeld { .. }) => {}
                    Err(e) if e.is_transient() => {}
                    Err(e) => self.state.violation(
                        ViolationKind::UnexpectedError,
                        &self.state.keys[key],
                        format!("{}: release failed with {e}", self.who),
                    ),
                }
            }
            other => {
                self.state.count(|c| c.ends.1 += 1);
                drop(other);
            }
        }
    }

    /// One `Locker::run` with a random job length and hard timeout.
    async fn run_job(&mut self, key: usize, ttl: Duration, watchdog: bool) {
        let job_len = ttl.mul_f64(self.rng.gen_range(0.0..2.0));
        let job_timeout = self
            .rng
            .gen_bool(0.5)
            .then(|| ttl.mul_f64(self.rng.gen_range(0.25..2.0)));
        // The job's belief bound below counts from before the acquire: after a long wait
        // the job no longer counts as believing (its writes are skipped), but its outcome
        // is still checked.
        let wait = match self.rng.gen_range(0..3) {
            0 => WaitStrategy::Skip,
            1 => WaitStrategy::Wait(self.upto(ttl / 4)),
            _ => WaitStrategy::Wait(self.upto(self.state.ttl_max * 2)),
        };
        let mut opts = LockOptions::new().ttl(ttl).wait(wait).watchdog(watchdog);
        if let Some(t) = job_timeout {
            opts = opts.job_timeout(t);
        }
        let alive = Arc::new(AtomicBool::new(false));
        let started: Arc<Mutex<Option<Instant>>> = Arc::default();
        let before = Instant::now();
        // The guard's validity counts from before its grant request, sent after `before`,
        // minus the backend's drift allowance: half the TTL is a safe lower bound.
        let me = Holding {
            id: self.state.next_id.fetch_add(1, Ordering::SeqCst),
            who: format!(
                "{} [run job, ttl {ttl:?}, watchdog {}]",
                self.who,
                if watchdog { "on" } else { "off" }
            ),
            key,
            fence: None,
            since: before,
            belief: Belief::Job {
                alive: alive.clone(),
                until: before + ttl / 2,
            },
        };
        let writes = self.rng.gen_range(2..=5u32);
        let job = {
            let (state, alive, started) = (self.state.clone(), alive.clone(), started.clone());
            async move {
                let _alive = Alive::set(alive);
                let t0 = Instant::now();
                *lock(&started) = Some(t0);
                for _ in 0..writes {
                    state.write(&me);
                    tokio::time::sleep(job_len / writes).await;
                }
                state.leave(&me);
                t0.elapsed()
            }
        };
        let result = self.locker.run(&*self.state.keys[key], &opts, job).await;
        let returned = Instant::now();
        let key_name = self.state.keys[key].clone();
        if alive.load(Ordering::SeqCst) {
            self.state.violation(
                ViolationKind::RunOutcome,
                &key_name,
                format!(
                    "{}: run returned {result:?} but its job was not dropped",
                    self.who
                ),
            );
        }
        let ran_for = lock(&started).map(|t| returned.saturating_duration_since(t));
        let slack = Duration::from_millis(50) + self.state.ttl_min / 2;
        match result {
            Ok(Outcome::Ran(took)) => {
                self.state.count(|c| c.runs[0] += 1);
                if let Some(t) = job_timeout.filter(|t| took > *t + slack) {
                    self.state.violation(
                        ViolationKind::RunOutcome,
                        &key_name,
                        format!(
                            "{}: the job ran {took:?}, past its hard timeout {t:?}",
                            self.who
                        ),
                    );
                }
                if !watchdog && took > ttl + slack {
                    self.state.violation(
                        ViolationKind::RunOutcome,
                        &key_name,
                        format!(
                            "{}: with the watchdog off the job ran {took:?}, past its lock's \
                             TTL {ttl:?}, and was not cancelled",
                            self.who
                        ),
                    );
                }
            }
            Ok(Outcome::Skipped) => self.state.count(|c| c.runs[1] += 1),
            Ok(Outcome::TimedOut) => {
                self.state.count(|c| c.runs[2] += 1);
                let early = match (job_timeout, ran_for) {
                    (None, _) => Some("without a hard timeout".to_owned()),
                    (Some(t), Some(r)) if r + Duration::from_millis(2) < t => {
                        Some(format!("after {r:?}, before its hard timeout {t:?}"))
                    }
                    _ => None,
                };
                if let Some(why) = early {
                    self.state.violation(
                        ViolationKind::RunOutcome,
                        &key_name,
                        format!("{}: run reported TimedOut {why}", self.who),
                    );
                }
            }
            Ok(Outcome::LockLost) => self.state.count(|c| c.runs[3] += 1),
            Err(e) => self.acquire_failed(&key_name, e).await,
        }
    }
}

/// Marks a job alive while it exists (set on its first poll, cleared when it is dropped).
struct Alive(Arc<AtomicBool>);

impl Alive {
    fn set(flag: Arc<AtomicBool>) -> Self {
        flag.store(true, Ordering::SeqCst);
        Alive(flag)
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
