//! Workloads and measurements shared by every backend's benchmark, so that each backend and
//! each peer runs exactly the same code around its lock calls and is reported alike.
// Each bench includes this module but uses only part of it (memory reads no server CPU,
// etcd measures no CPU at all, redlock alternates its own rounds).
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};
use distlock::{LockGuard, LockOptions, Locker};
use tokio::runtime::Runtime;

/// Lease every subject asks for: longer than any cycle, so nothing expires mid-run.
pub const TTL: Duration = Duration::from_secs(10);

/// The runtime of every bench: two workers, as many as the machine has cores.
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Criterion settings of every bench: few samples, since each is a whole batch of cycles.
pub fn criterion(measurement: Duration) -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(measurement)
}

/// A lock implementation under measurement: distlock on some backend, or a peer.
pub trait Subject: Clone + Send + Sync + 'static {
    /// What holding the lock looks like.
    type Guard: Send;
    /// Takes `key`, waiting as long as needed.
    fn lock(&self, key: Arc<str>) -> impl Future<Output = Self::Guard> + Send;
    /// Gives it back.
    fn unlock(&self, guard: Self::Guard) -> impl Future<Output = ()> + Send;
}

/// distlock's Locker with the watchdog off (like for like with peers that do not renew).
#[derive(Clone)]
pub struct Distlock {
    pub locker: Locker,
    pub opts: LockOptions,
}

impl Distlock {
    pub fn new(locker: Locker) -> Self {
        Distlock {
            locker,
            opts: LockOptions::new().ttl(TTL).wait_forever().watchdog(false),
        }
    }
}

impl Subject for Distlock {
    type Guard = LockGuard;
    async fn lock(&self, key: Arc<str>) -> LockGuard {
        self.locker
            .acquire(&key, &self.opts)
            .await
            .expect("acquire")
    }
    async fn unlock(&self, guard: LockGuard) {
        guard.release().await.expect("release");
    }
}

/// Runs `iters` acquire+release cycles on one task and one key.
pub async fn uncontended<S: Subject>(s: &S, iters: u64) -> Duration {
    let key: Arc<str> = Arc::from("bench/uncontended");
    let start = Instant::now();
    for _ in 0..iters {
        let g = s.lock(key.clone()).await;
        s.unlock(g).await;
    }
    start.elapsed()
}

/// Runs `iters` cycles in total spread over `tasks` tasks, each on its own key.
pub async fn distinct_keys<S: Subject>(s: &S, tasks: usize, iters: u64) -> Duration {
    let per_task = iters.div_ceil(tasks as u64);
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let s = s.clone();
            let key: Arc<str> = Arc::from(format!("bench/distinct/{i}"));
            tokio::spawn(async move {
                for _ in 0..per_task {
                    let g = s.lock(key.clone()).await;
                    s.unlock(g).await;
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("task");
    }
    start.elapsed()
}

/// The two throughput workloads every bench runs for each subject.
#[derive(Debug, Clone, Copy)]
pub enum Workload {
    /// [`uncontended`]: one task, one key.
    Uncontended,
    /// [`distinct_keys`] over this many tasks.
    DistinctKeys(usize),
}

/// Uncontended, then 64 tasks on distinct keys: the order of the groups and report lines.
pub const WORKLOADS: [Workload; 2] = [Workload::Uncontended, Workload::DistinctKeys(64)];

impl Workload {
    /// Runs `iters` cycles of this workload on `s`.
    pub async fn run<S: Subject>(self, s: &S, iters: u64) -> Duration {
        match self {
            Workload::Uncontended => uncontended(s, iters).await,
            Workload::DistinctKeys(tasks) => distinct_keys(s, tasks, iters).await,
        }
    }

    /// Name in report lines.
    pub fn title(self) -> String {
        match self {
            Workload::Uncontended => "uncontended, 1 task".to_owned(),
            Workload::DistinctKeys(tasks) => format!("{tasks} tasks, distinct keys"),
        }
    }

    /// Criterion group of `backend` for this workload.
    pub fn group(self, backend: &str) -> String {
        match self {
            Workload::Uncontended => format!("{backend}/uncontended"),
            Workload::DistinctKeys(tasks) => format!("{backend}/{tasks}-tasks-distinct-keys"),
        }
    }
}

/// Adds subject `s` as `name` to group `g`, timing `w` on runtime `rt`.
pub fn bench_subject<S: Subject>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    name: &str,
    s: &S,
    w: Workload,
) {
    g.bench_function(name, |b| {
        b.to_async(rt).iter_custom(|n| {
            let s = s.clone();
            async move { w.run(&s, n).await }
        })
    });
}

/// What a contended run on one key measured.
#[derive(Debug, Clone)]
pub struct Contention {
    pub cycles: u64,
    pub elapsed: Duration,
    /// Longest time any task waited for the lock.
    pub worst_wait: Duration,
    /// Mean time a holder actually held the lock (the hold sleep as the timer delivered it).
    pub mean_hold: Duration,
    /// Cycles completed by each task.
    pub per_task: Vec<u64>,
}

impl Contention {
    pub fn throughput(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64()
    }
    /// The goal's bound: 1.5 × tasks × hold, with hold as actually delivered by the timer.
    pub fn wait_bound(&self) -> Duration {
        self.mean_hold.mul_f64(1.5 * self.per_task.len() as f64)
    }
    pub fn summary(&self, name: &str) -> String {
        let min = self.per_task.iter().min().copied().unwrap_or(0);
        let max = self.per_task.iter().max().copied().unwrap_or(0);
        format!(
            "{name}: {:.0} cycles/s, worst wait {:.1} ms (bound 1.5 x tasks x hold = {:.1} ms), \
             mean hold {:.2} ms, per-task cycles {min}..{max}",
            self.throughput(),
            self.worst_wait.as_secs_f64() * 1e3,
            self.wait_bound().as_secs_f64() * 1e3,
            self.mean_hold.as_secs_f64() * 1e3,
        )
    }
}

/// `tasks` tasks take one key in turn for `run_for`, each holding it for `hold`.
pub async fn one_key<S: Subject>(
    s: &S,
    tasks: usize,
    hold: Duration,
    run_for: Duration,
) -> Contention {
    let key: Arc<str> = Arc::from(format!("bench/one/{:08x}", rand_u32()));
    let start = Instant::now();
    let deadline = start + run_for;
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (s, key) = (s.clone(), key.clone());
            tokio::spawn(async move {
                let (mut cycles, mut worst, mut held) = (0u64, Duration::ZERO, Duration::ZERO);
                while Instant::now() < deadline {
                    let asked = Instant::now();
                    let g = s.lock(key.clone()).await;
                    let got = Instant::now();
                    worst = worst.max(got - asked);
                    tokio::time::sleep(hold).await;
                    held += got.elapsed();
                    s.unlock(g).await;
                    cycles += 1;
                }
                (cycles, worst, held)
            })
        })
        .collect();
    let mut result = Contention {
        cycles: 0,
        elapsed: Duration::ZERO,
        worst_wait: Duration::ZERO,
        mean_hold: Duration::ZERO,
        per_task: Vec::new(),
    };
    let mut held = Duration::ZERO;
    for h in handles {
        let (cycles, worst, task_held) = h.await.expect("task");
        result.cycles += cycles;
        result.worst_wait = result.worst_wait.max(worst);
        result.per_task.push(cycles);
        held += task_held;
    }
    result.elapsed = start.elapsed();
    result.mean_hold = held / result.cycles.max(1) as u32;
    result
}

/// Tasks and hold time of the one-key contention workload.
pub const CONTENDERS: usize = 16;
pub const HOLD: Duration = Duration::from_millis(1);

/// The one-key contention workload run on ours, then on a peer, each for `run_for`.
pub struct OneKey {
    pub ours: Contention,
    pub peer: Contention,
}

impl OneKey {
    pub async fn run<A: Subject, B: Subject>(ours: &A, peer: &B, run_for: Duration) -> Self {
        OneKey {
            ours: one_key(ours, CONTENDERS, HOLD, run_for).await,
            peer: one_key(peer, CONTENDERS, HOLD, run_for).await,
        }
    }

    /// Prints the workload's heading and both summaries, the peer's as `peer_name`.
    pub fn print(&self, peer_name: &str) {
        eprintln!("{CONTENDERS} tasks, one key, {} ms hold:", HOLD.as_millis());
        eprintln!("  {}", self.ours.summary("distlock"));
        eprintln!("  {}", self.peer.summary(peer_name));
    }

    /// Prints the throughput ratio against the peer (called `peer_label`) and whether our
    /// worst wait kept the goal's bound.
    pub fn print_ratio(&self, peer_label: &str, goal: &str) {
        eprintln!(
            "  throughput ours/{peer_label} {:.2}{goal}; worst wait within 1.5 x tasks x hold: {}",
            self.ours.throughput() / self.peer.throughput(),
            self.ours.worst_wait < self.ours.wait_bound()
        );
    }
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish() as u32
}

/// How many cycles of `batch` take about `round`: a trial batch grows fourfold from `first`
/// until it takes a quarter of `round` (or grows past `first << 20`), then is scaled.
pub async fn batch_size<F, Fut>(round: Duration, first: u64, mut batch: F) -> u64
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Duration>,
{
    let mut n = first;
    loop {
        let took = batch(n).await;
        if took >= round / 4 || n > first << 20 {
            return ((n as f64) * round.as_secs_f64() / took.as_secs_f64().max(1e-9)).max(1.0)
                as u64;
        }
        n *= 4;
    }
}

/// Cycles per second of a closure measured over about `run_for`.
pub async fn rate<F, Fut>(run_for: Duration, mut batch: F) -> f64
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Duration>,
{
    let n = batch_size(run_for, 64, &mut batch).await;
    let took = batch(n).await;
    n as f64 / took.as_secs_f64()
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// CPU seconds (user + system) process `pid` used so far, from `/proc/<pid>/stat` (clock
/// ticks of 10 ms: precise enough over a whole measurement); 0 where unavailable.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name (which may hold spaces); utime and stime
    // are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// Rounds per subject in [`interleaved`].
pub const ROUNDS: usize = 7;

/// A workload bound to one subject, so subjects of different types share one round loop.
pub type Timed<'a> = Box<dyn FnMut(u64) -> Pin<Box<dyn Future<Output = Duration> + 'a>> + 'a>;

/// `w` on `s`, as one of [`interleaved`]'s subjects.
pub fn timed<'a, S: Subject>(s: &'a S, w: Workload) -> Timed<'a> {
    Box::new(move |n| Box::pin(w.run(s, n)))
}

/// What [`interleaved`] measured, per subject in the order given.
pub struct Rounds {
    round: Duration,
    /// Cycles per second, one a round.
    rates: Vec<Vec<f64>>,
    /// Cycles, client CPU seconds and server CPU seconds, summed over the rounds.
    cpu: Vec<(f64, f64, f64)>,
}

/// Cycles per second of each subject in [`ROUNDS`] rounds of about `round` each, after sizing
/// each batch once; in every round the subjects run back to back in the order given (the
/// machine may be shared), so ratios are taken per round. `cpu` reads the CPU seconds used so
/// far by this process (client) and by the server, before and after each batch: unlike
/// throughput, CPU per cycle does not depend on what else the machine runs.
pub async fn interleaved<C, CFut>(
    round: Duration,
    mut subjects: Vec<Timed<'_>>,
    mut cpu: C,
) -> Rounds
where
    C: FnMut() -> CFut,
    CFut: Future<Output = (f64, f64)>,
{
    let mut sizes = Vec::new();
    for run in &mut subjects {
        sizes.push(batch_size(round, 16, run).await);
    }
    let mut rounds = Rounds {
        round,
        rates: vec![Vec::new(); subjects.len()],
        cpu: vec![(0.0, 0.0, 0.0); subjects.len()],
    };
    for _ in 0..ROUNDS {
        for (i, run) in subjects.iter_mut().enumerate() {
            let (client, server) = cpu().await;
            let rate = sizes[i] as f64 / run(sizes[i]).await.as_secs_f64();
            let (client_after, server_after) = cpu().await;
            let sum = &mut rounds.cpu[i];
            sum.0 += sizes[i] as f64;
            sum.1 += client_after - client;
            sum.2 += server_after - server;
            rounds.rates[i].push(rate);
        }
    }
    rounds
}

/// The `cpu` argument of [`interleaved`] for a bench that reports no CPU.
pub fn no_cpu() -> std::future::Ready<(f64, f64)> {
    std::future::ready((0.0, 0.0))
}

impl Rounds {
    /// Median rate of subject `i`.
    pub fn rate(&self, i: usize) -> f64 {
        median(self.rates[i].clone())
    }

    /// Median over the rounds of subject `i`'s rate over subject `j`'s.
    pub fn ratio(&self, i: usize, j: usize) -> f64 {
        let per_round = self.rates[i].iter().zip(&self.rates[j]).map(|(a, b)| a / b);
        median(per_round.collect())
    }

    /// Client and server CPU per cycle of subject `i`, in µs.
    pub fn cpu_per_cycle(&self, i: usize) -> (f64, f64) {
        let (cycles, client, server) = self.cpu[i];
        (client * 1e6 / cycles, server * 1e6 / cycles)
    }

    /// One report line of every subject's client and server CPU per cycle, in `names`
    /// order: `  CPU per cycle (client + <server>, µs): ours 9.4 + 8.1, peer …`.
    pub fn cpu_line(&self, names: &[&str], server: &str) -> String {
        let parts: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let (client, server) = self.cpu_per_cycle(i);
                format!("{name} {client:.1} + {server:.1}")
            })
            .collect();
        format!(
            "  CPU per cycle (client + {server}, µs): {}",
            parts.join(", ")
        )
    }

    /// The note on how the rates were taken, printed once above the lines.
    pub fn note(&self) -> String {
        format!(
            "(medians over {ROUNDS} interleaved rounds of ~{:?} per subject)",
            self.round
        )
    }

    /// Two report lines for workload `w`: each subject's median rate under its name (ours
    /// first), then ours over each peer with that peer's goal (`goals[k]` for subject k + 1).
    pub fn lines(&self, w: Workload, names: &[&str], goals: &[&str]) -> String {
        let rates: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(i, name)| format!("{name} {:.0}", self.rate(i)))
            .collect();
        let ratios: Vec<String> = names[1..]
            .iter()
            .zip(goals)
            .enumerate()
            .map(|(k, (peer, goal))| {
                format!("{}/{peer} {:.2}{goal}", names[0], self.ratio(0, k + 1))
            })
            .collect();
        format!(
            "{}: {} cycles/s\n  {}",
            w.title(),
            rates.join(", "),
            ratios.join(", ")
        )
    }
}
