//! Workloads shared by every backend's benchmark, so that each backend and each peer runs
//! exactly the same code around its lock calls.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{LockGuard, LockOptions, Locker};

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
            opts: LockOptions::new()
                .ttl(Duration::from_secs(10))
                .wait_forever()
                .watchdog(false),
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

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish() as u32
}

/// Cycles per second of a closure measured over about `run_for`.
pub async fn rate<F, Fut>(run_for: Duration, mut batch: F) -> f64
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Duration>,
{
    let mut iters = 64u64;
    loop {
        let took = batch(iters).await;
        if took >= run_for / 4 || iters > 1 << 26 {
            let n = (iters as f64 * run_for.as_secs_f64() / took.as_secs_f64().max(1e-9)) as u64;
            let n = n.max(1);
            let took = batch(n).await;
            return n as f64 / took.as_secs_f64();
        }
        iters *= 4;
    }
}
