//! What a run of the checker reports: the kinds of broken rules, each finding, counts of
//! what the run did, and the report.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// Environment variable forcing the checker's seed (decimal or `0x` hex); a report
/// names it with the seed to replay.
pub const SEED_ENV: &str = "DISTLOCK_CHECK_SEED";

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
    /// An election's observer was told a term lower than one it was told before.
    ObservedOrder,
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
    /// Set when the phase's fault allows this kind (see [`Fault::allow`](super::Fault::allow)): why.
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
    /// Election mode: proclamations that succeeded / failed.
    pub proclaims: (u64, u64),
    /// Election mode: leadership changes the observers were told.
    pub observed: u64,
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
             {}/{} ok/failed, ends {}/{} release/drop, runs {:?} ran/skipped/timed-out/lost, \
             proclaims {}/{} ok/failed, {} leadership changes observed",
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
            c.runs,
            c.proclaims.0,
            c.proclaims.1,
            c.observed
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
