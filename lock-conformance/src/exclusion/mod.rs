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
//! use lock_conformance::exclusion::{Exclusion, ExclusionConfig};
//!
//! let report = Exclusion::new(lockers)
//!     .config(ExclusionConfig::from_env())
//!     .run()
//!     .await;
//! report.assert_clean();
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;

mod config;
mod report;
mod state;
mod worker;

use config::Probe;
pub use config::{ExclusionConfig, Fault, Grants, ProbeFuture, DEFAULT_DURATION, SOAK_ENV};
pub use report::{Counters, Report, Violation, ViolationKind, SEED_ENV};
use state::{Phase, State};
use worker::Worker;

use lock_core::sync::lock;
use lock_core::{Capabilities, Error, Locker};

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
    /// ([`Admin::inspect`](lock_core::Admin::inspect); skipped without one).
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
            "exclusion [{}]: seed {seed} (replay: {SEED_ENV}={seed}); {:?}; {} lockers × {} \
             tasks on {} keys; TTL {ttl_min:?}..{ttl_max:?}; {:?} over phases {phases:?}",
            caps.name,
            self.config.grants,
            self.lockers.len(),
            self.config.tasks_per_locker,
            keys.len(),
            self.config.duration,
        );
        let state = Arc::new(State {
            start: Instant::now(),
            caps,
            grants: self.config.grants,
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
        let (stop_observing, observing) = tokio::sync::watch::channel(false);
        let observers: Vec<_> = match self.config.grants {
            Grants::Election => self
                .lockers
                .iter()
                .enumerate()
                .flat_map(|(l, locker)| (0..keys.len()).map(move |k| (l, locker, k)))
                .map(|(l, locker, k)| {
                    let observer = observe(state.clone(), locker.clone(), l, k, observing.clone());
                    tokio::spawn(observer)
                })
                .collect(),
            _ => Vec::new(),
        };
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
        let _ = stop_observing.send(true);
        for observer in observers {
            if tokio::time::timeout(drain, observer).await.is_err() {
                state.violation(
                    ViolationKind::Hang,
                    "",
                    format!("an election observer did not stop within {drain:?}"),
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

/// Follows the election `state.keys[key]` through `locker` until `stop`: every answer's
/// term must be at least the last one's (a term never goes back).
async fn observe(
    state: Arc<State>,
    locker: Locker,
    l: usize,
    key: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let name = state.keys[key].clone();
    let mut watch = match locker.election(&name) {
        Ok(election) => election.observe(),
        Err(e) => {
            let detail = format!("L{l}: no election to observe: {e}");
            return state.violation(ViolationKind::UnexpectedError, &name, detail);
        }
    };
    let mut last: Option<u64> = None;
    loop {
        let answer = tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return,
            answer = watch.changed() => answer,
        };
        match answer {
            Ok(leader) => {
                state.count(|c| c.observed += 1);
                let Some(leader) = leader else { continue };
                if let Some(before) = last.filter(|t| leader.term < *t) {
                    let detail = format!(
                        "L{l}'s observer was told term {} after term {before}",
                        leader.term
                    );
                    state.violation(ViolationKind::ObservedOrder, &name, detail);
                }
                last = Some(last.map_or(leader.term, |t| t.max(leader.term)));
            }
            Err(e) if e.is_transient() => {
                tokio::time::sleep(state.ttl_min).await;
            }
            Err(e) => {
                let detail = format!("L{l}'s observer failed with {e}");
                return state.violation(ViolationKind::UnexpectedError, &name, detail);
            }
        }
    }
}

/// The seed of a seeded checker run: [`SEED_ENV`] (decimal or `0x` hex; empty counts as
/// unset), else `configured`, else a random one. A value that is not a seed is said and
/// ignored.
pub fn resolve_seed(configured: Option<u64>) -> u64 {
    if let Some(s) = std::env::var(SEED_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
    {
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
    let round = |d: Duration| {
        caps.effective_ttl(d)
            .map_or(caps.min_ttl.max(d), |t| t.get())
    };
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

/// The default keys-left probe: [`Admin::inspect`](lock_core::Admin::inspect) of every key.
async fn inspect_left(locker: &Locker, keys: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    let Some(admin) = locker.backend().admin() else {
        eprintln!("exclusion: the backend cannot inspect keys; keys-left check skipped");
        return left;
    };
    for key in keys {
        match admin.inspect(key).await {
            Ok(holders) if holders.is_empty() => {}
            Ok(holders) => left.push(format!("{key} ({holders:?})")),
            Err(Error::Unsupported { .. }) => {
                eprintln!("exclusion: the backend cannot inspect keys; keys-left check skipped");
                return left;
            }
            Err(e) => left.push(format!("{key} (inspect failed: {e})")),
        }
    }
    left
}
