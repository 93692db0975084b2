//! One run's shared state: the fenced resource, its occupants and their beliefs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::config::Grants;
use super::report::{Counters, Violation, ViolationKind};
use lock_core::sync::lock;
use lock_core::{Capabilities, LockGuard, Permits};

/// Violations kept in full per kind in a [`Report`](super::Report); the rest are only counted.
const KEEP_PER_KIND: usize = 50;

pub(super) struct Phase {
    pub(super) name: String,
    pub(super) allowed: Vec<(ViolationKind, &'static str)>,
}

#[derive(Default)]
pub(super) struct Found {
    pub(super) violations: Vec<Violation>,
    pub(super) allowed: Vec<Violation>,
    pub(super) totals: BTreeMap<ViolationKind, u64>,
    pub(super) allowed_totals: BTreeMap<ViolationKind, u64>,
}

/// How a holder's belief is read by others.
#[derive(Clone)]
pub(super) enum Belief {
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
    pub(super) fn sample(&self) -> (bool, Instant) {
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
    pub(super) fn not_lost(&self) -> bool {
        match self {
            Belief::Guard(guard) => guard.upgrade().is_some_and(|g| !g.is_lost()),
            Belief::Job { alive, .. } => alive.load(Ordering::SeqCst),
        }
    }
}

pub(super) struct Occupant {
    pub(super) id: u64,
    pub(super) who: String,
    pub(super) permits: Permits,
    pub(super) fence: Option<u64>,
    pub(super) since: Instant,
    pub(super) belief: Belief,
}

#[derive(Default)]
pub(super) struct KeyState {
    pub(super) occupants: Vec<Occupant>,
    /// The highest fence accepted and the holder that wrote it.
    pub(super) max_fence: Option<(u64, u64, String)>,
    /// The highest fence accepted from an exclusive holder (a lock, a writer): every grant
    /// with a lower fence was over before it, whatever it claimed.
    pub(super) max_exclusive_fence: Option<(u64, u64, String)>,
}

pub(super) struct State {
    pub(super) start: Instant,
    pub(super) caps: Capabilities,
    pub(super) grants: Grants,
    pub(super) ttl_min: Duration,
    pub(super) ttl_max: Duration,
    pub(super) keys: Vec<Arc<str>>,
    pub(super) resource: Vec<Mutex<KeyState>>,
    pub(super) phase: Mutex<Phase>,
    pub(super) found: Mutex<Found>,
    pub(super) counters: Mutex<Counters>,
    pub(super) next_id: AtomicU64,
}

/// One hold's identity at the resource.
pub(super) struct Holding {
    pub(super) id: u64,
    pub(super) who: String,
    pub(super) permits: Permits,
    pub(super) key: usize,
    pub(super) fence: Option<u64>,
    pub(super) since: Instant,
    pub(super) belief: Belief,
}

impl State {
    /// What the next grant claims, drawn for the run's kind of grants.
    pub(super) fn draw_permits(&self, rng: &mut rand::rngs::StdRng) -> Permits {
        use rand::RngExt as _;
        match self.grants {
            Grants::Locks => Permits::LOCK,
            Grants::Permits(of) => {
                let take = rng.random_range(1..=of.clamp(1, 2));
                Permits::new(take, of.max(1)).unwrap_or(Permits::LOCK)
            }
            Grants::ReaderWriter if rng.random_bool(0.7) => Permits::read(),
            Grants::ReaderWriter => Permits::write(),
            Grants::Election => Permits::LOCK,
        }
    }

    pub(super) fn at(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.start).as_secs_f64()
    }

    pub(super) fn count(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut lock(&self.counters));
    }

    pub(super) fn violation(&self, kind: ViolationKind, key: &str, detail: String) {
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
    pub(super) fn write(&self, me: &Holding) -> bool {
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
            // The others believing now, and the permits they claim with ours: more than
            // the key's permits is an overlap (for a lock: anyone else at all).
            let mut claimed = u64::from(me.permits.take());
            for o in ks.occupants.iter().filter(|o| o.id != me.id) {
                let (other_believes, other_until) = o.belief.sample();
                if other_believes {
                    claimed += u64::from(o.permits.take());
                    suspects.push((o.who.clone(), o.fence, o.since, other_until));
                }
            }
            if claimed <= u64::from(me.permits.of()) {
                suspects.clear();
            }
            if !ks.occupants.iter().any(|o| o.id == me.id) {
                ks.occupants.push(Occupant {
                    id: me.id,
                    who: me.who.clone(),
                    permits: me.permits,
                    fence: me.fence,
                    since: me.since,
                    belief: me.belief.clone(),
                });
            }
            let mut fence_issue = None;
            let mut accepted = true;
            if let Some(f) = me.fence {
                // Stale: below a fence that excluded this grant (an exclusive holder's, or
                // any later grant's when this one is exclusive); for locks, below any.
                let excluding = if me.permits.is_exclusive() {
                    &ks.max_fence
                } else {
                    &ks.max_exclusive_fence
                };
                match (excluding, &ks.max_fence) {
                    (Some((max, _, who)), _) if f < *max => {
                        accepted = false;
                        fence_issue = Some((ViolationKind::StaleFence, *max, who.clone()));
                    }
                    (_, Some((max, id, who))) if f == *max && *id != me.id => {
                        fence_issue = Some((ViolationKind::DuplicateFence, *max, who.clone()));
                    }
                    _ => {
                        if ks.max_fence.as_ref().is_none_or(|(max, ..)| f > *max) {
                            ks.max_fence = Some((f, me.id, me.who.clone()));
                        }
                        let exclusive_max = &ks.max_exclusive_fence;
                        if me.permits.is_exclusive()
                            && exclusive_max.as_ref().is_none_or(|(max, ..)| f > *max)
                        {
                            ks.max_exclusive_fence = Some((f, me.id, me.who.clone()));
                        }
                    }
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
    pub(super) fn leave(&self, me: &Holding) {
        lock(&self.resource[me.key])
            .occupants
            .retain(|o| o.id != me.id);
    }
}
