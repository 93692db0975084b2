//! One run's shared state (the fenced resource, its occupants and their beliefs) and the
//! tasks that draw and perform each iteration.

use super::*;

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
    pub(super) fence: Option<u64>,
    pub(super) since: Instant,
    pub(super) belief: Belief,
}

#[derive(Default)]
pub(super) struct KeyState {
    pub(super) occupants: Vec<Occupant>,
    /// The highest fence accepted and the holder that wrote it.
    pub(super) max_fence: Option<(u64, u64, String)>,
}

pub(super) struct State {
    pub(super) start: Instant,
    pub(super) caps: Capabilities,
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
    pub(super) key: usize,
    pub(super) fence: Option<u64>,
    pub(super) since: Instant,
    pub(super) belief: Belief,
}

impl State {
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
    pub(super) fn leave(&self, me: &Holding) {
        lock(&self.resource[me.key])
            .occupants
            .retain(|o| o.id != me.id);
    }
}

pub(super) struct Worker {
    pub(super) state: Arc<State>,
    pub(super) locker: Locker,
    pub(super) who: String,
    pub(super) rng: StdRng,
    pub(super) round_end: Instant,
}

/// What an iteration does.
pub(super) enum Step {
    Acquire,
    Cancelled(Duration),
    Run,
}

impl Worker {
    pub(super) async fn run(mut self) {
        while Instant::now() < self.round_end {
            self.state.count(|c| c.iterations += 1);
            self.iteration().await;
        }
    }

    pub(super) fn draw_ttl(&mut self) -> Duration {
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

    pub(super) fn upto(&mut self, max: Duration) -> Duration {
        max.mul_f64(self.rng.gen_range(0.0..=1.0))
    }

    pub(super) async fn iteration(&mut self) {
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

    pub(super) async fn acquire_failed(&mut self, key: &str, e: Error) {
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
    pub(super) async fn hold(
        &mut self,
        key: usize,
        guard: LockGuard,
        ttl: Duration,
        watchdog: bool,
    ) {
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
    pub(super) async fn run_job(&mut self, key: usize, ttl: Duration, watchdog: bool) {
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
pub(super) struct Alive(pub(super) Arc<AtomicBool>);

impl Alive {
    pub(super) fn set(flag: Arc<AtomicBool>) -> Self {
        flag.store(true, Ordering::SeqCst);
        Alive(flag)
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
