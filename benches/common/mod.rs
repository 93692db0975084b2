//! The harness every backend's benchmark shares: a program shaped like a user's
//! (`#[tokio::main]` with the default runtime, one `distlock::connect(url)` per subject,
//! guards from `Locker::lock` with the default options, ended by `release().await` or by
//! drop), the same workloads for every subject, rounds interleaved so that every ratio
//! compares subjects measured back to back on the same servers, and a report of ratios
//! (never absolute times alone) with the client's and the server's CPU per cycle.
//!
//! **Each subject runs in its own process**, as a user's program does: the bench starts
//! the servers, then for every round of every subject runs its own executable again as a
//! child ([`Child`]: the subject's name, the servers' URL, the workload and the round's
//! length in `DISTLOCK_BENCH_*` variables), which connects, runs the round on a fresh
//! `#[tokio::main]` runtime of its own and prints its [`Sample`]. Nothing of one subject
//! (its runtime's threads, its connections, its background tasks, its allocator's state)
//! is shared with another's round.
//!
//! `cargo bench --features full` runs every bench; each prints its table and writes
//! `target/bench-ratios/<backend>.json`, from which `scripts/bench-table.py` makes the
//! README's table. Run without `--bench` (as `cargo test --benches` does) a bench makes one
//! short round only, to prove it runs.
// Each bench includes this module but uses only part of it.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{LockGuard, LockOptions, Locker};

/// How long a subject runs per round, and how many rounds there are.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub round: Duration,
    pub rounds: usize,
}

impl Settings {
    /// From the command line: `cargo bench` passes `--bench`, and then every subject runs
    /// `DISTLOCK_BENCH_ROUNDS` rounds (default 7) of `DISTLOCK_BENCH_ROUND_MS` (default 500)
    /// each; without `--bench`, one round of 50 ms (a smoke run).
    pub fn from_args() -> Self {
        let bench = std::env::args().any(|a| a == "--bench");
        let env = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|v| *v > 0)
                .unwrap_or(default)
        };
        if bench {
            Settings {
                round: Duration::from_millis(env("DISTLOCK_BENCH_ROUND_MS", 500)),
                rounds: env("DISTLOCK_BENCH_ROUNDS", 7) as usize,
            }
        } else {
            Settings {
                round: Duration::from_millis(50),
                rounds: 1,
            }
        }
    }
}

/// A lock implementation under measurement: distlock on some backend, or a peer.
pub trait Subject: Send + Sync + 'static {
    /// What holding the lock looks like.
    type Guard: Send;
    /// Takes `key`, waiting as long as needed.
    fn lock(&self, key: Arc<str>) -> impl Future<Output = Self::Guard> + Send;
    /// Gives it back.
    fn unlock(&self, guard: Self::Guard) -> impl Future<Output = ()> + Send;
}

/// How a distlock subject ends its guards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// `guard.release().await`.
    Release,
    /// `drop(guard)`: the RAII way, released in the background.
    Drop,
}

/// distlock as a user's program has it: `distlock::connect(url)`, then `locker.lock(key)`
/// with the default options (watchdog on, fencing and release notices as the URL says).
pub struct Distlock {
    pub locker: Locker,
    pub end: End,
    /// Options other than the Locker's defaults, when set (e.g. the watchdog off).
    pub opts: Option<LockOptions>,
}

impl Distlock {
    /// A subject with a Locker (and so connections) of its own.
    pub async fn connect(url: &str, end: End) -> Arc<Self> {
        let locker = distlock::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}"));
        Arc::new(Distlock {
            locker,
            end,
            opts: None,
        })
    }

    /// A subject like [`connect`](Self::connect)'s whose guards have no watchdog (like for
    /// like with a peer that does not renew).
    pub async fn without_watchdog(url: &str, end: End) -> Arc<Self> {
        let subject = Arc::into_inner(Self::connect(url, end).await).expect("fresh");
        let opts = subject.locker.default_options().clone().watchdog(false);
        Arc::new(Distlock {
            opts: Some(opts),
            ..subject
        })
    }
}

impl Subject for Distlock {
    type Guard = LockGuard;
    async fn lock(&self, key: Arc<str>) -> LockGuard {
        match &self.opts {
            None => self.locker.lock(&key).await.expect("lock"),
            Some(opts) => self.locker.acquire(&key, opts).await.expect("acquire"),
        }
    }
    async fn unlock(&self, guard: LockGuard) {
        match self.end {
            End::Release => guard.release().await.expect("release"),
            End::Drop => drop(guard),
        }
    }
}

/// The workloads every bench runs on every subject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// One task, one key, cycles back to back: the cost of one acquisition and release.
    Lone,
    /// This many tasks, each on a key of its own.
    Distinct(usize),
    /// This many tasks on one key, each holding it this long: the hand-off under contention.
    OneKey(usize, Duration),
}

/// The three workloads, in report order.
pub const WORKLOADS: [Workload; 3] = [
    Workload::Lone,
    Workload::Distinct(64),
    Workload::OneKey(16, Duration::from_millis(1)),
];

impl Workload {
    /// Name in report lines and in the JSON document.
    pub fn title(self) -> String {
        match self {
            Workload::Lone => "1 task".to_owned(),
            Workload::Distinct(tasks) => format!("{tasks} tasks, distinct keys"),
            Workload::OneKey(tasks, hold) => {
                format!("{tasks} tasks, one key, {} ms hold", hold.as_millis())
            }
        }
    }

    /// The workload as a child's variable carries it.
    fn encode(self) -> String {
        match self {
            Workload::Lone => "lone".to_owned(),
            Workload::Distinct(tasks) => format!("distinct:{tasks}"),
            Workload::OneKey(tasks, hold) => format!("one:{tasks}:{}", hold.as_micros()),
        }
    }

    fn decode(s: &str) -> Workload {
        let parts: Vec<&str> = s.split(':').collect();
        let n = |i: usize| -> u64 { parts[i].parse().expect("a workload number") };
        match parts[0] {
            "lone" => Workload::Lone,
            "distinct" => Workload::Distinct(n(1) as usize),
            "one" => Workload::OneKey(n(1) as usize, Duration::from_micros(n(2))),
            other => panic!("no workload {other}"),
        }
    }

    fn tasks(self) -> usize {
        match self {
            Workload::Lone => 1,
            Workload::Distinct(tasks) | Workload::OneKey(tasks, _) => tasks,
        }
    }
}

/// What one subject did in one round of one workload.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub cycles: u64,
    pub elapsed: Duration,
    /// Longest time any task waited for a grant.
    pub worst_wait: Duration,
    /// Time spent holding, summed over the cycles (the hold sleep as the timer gave it).
    pub held: Duration,
    /// Cycles completed by each task.
    pub per_task: Vec<u64>,
    /// Client and server CPU seconds used during the round.
    pub client_cpu: f64,
    pub server_cpu: f64,
}

impl Sample {
    pub fn rate(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Cycles between two reads of the clock in the throughput workloads.
const CHECK_EVERY: u64 = 32;

/// Runs `w` on `s` for about `run_for`: every task loops lock, (hold,) unlock until the time
/// is up.
pub async fn measure<S: Subject>(s: &Arc<S>, w: Workload, run_for: Duration) -> Sample {
    let tag = rand_u32();
    let start = Instant::now();
    let deadline = start + run_for;
    let handles: Vec<_> = (0..w.tasks())
        .map(|i| {
            let s = s.clone();
            let key: Arc<str> = match w {
                Workload::OneKey(..) => Arc::from(format!("bench/one/{tag:08x}")),
                _ => Arc::from(format!("bench/{tag:08x}/{i}")),
            };
            tokio::spawn(async move {
                let (mut cycles, mut worst, mut held) = (0u64, Duration::ZERO, Duration::ZERO);
                match w {
                    Workload::OneKey(_, hold) => {
                        while Instant::now() < deadline {
                            let asked = Instant::now();
                            let g = s.lock(key.clone()).await;
                            let got = Instant::now();
                            worst = worst.max(got - asked);
                            if !hold.is_zero() {
                                tokio::time::sleep(hold).await;
                            }
                            held += got.elapsed();
                            s.unlock(g).await;
                            cycles += 1;
                        }
                    }
                    _ => {
                        while Instant::now() < deadline {
                            for _ in 0..CHECK_EVERY {
                                let g = s.lock(key.clone()).await;
                                s.unlock(g).await;
                            }
                            cycles += CHECK_EVERY;
                        }
                    }
                }
                (cycles, worst, held, Instant::now())
            })
        })
        .collect();
    let mut sample = Sample::default();
    let mut end = start;
    for h in handles {
        let (cycles, worst, held, done) = h.await.expect("bench task");
        sample.cycles += cycles;
        sample.worst_wait = sample.worst_wait.max(worst);
        sample.held += held;
        sample.per_task.push(cycles);
        end = end.max(done);
    }
    sample.elapsed = end - start;
    sample
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish() as u32
}

/// A random 128-bit value (owner tokens of the raw loops).
pub fn rand_u128() -> u128 {
    (u128::from(rand_u32()) << 96)
        ^ (u128::from(rand_u32()) << 64)
        ^ u128::from(rand_u32()) << 32
        ^ u128::from(rand_u32())
}

/// A subject under its report name; its rounds run in child processes.
pub struct Named {
    pub name: &'static str,
    /// Whether `DISTLOCK_BENCH_SUBJECTS` (a list of names; all when unset) picked it.
    picked: bool,
}

/// The subject called `name` in the report (the bench's [`Child`] branch builds it).
pub fn named(name: &'static str) -> Named {
    let picked = std::env::var("DISTLOCK_BENCH_SUBJECTS").unwrap_or_default();
    Named {
        name,
        picked: picked.is_empty() || picked.split(',').any(|p| p.trim() == name),
    }
}

/// The variables a child reads.
const CHILD: &str = "DISTLOCK_BENCH_CHILD";
const TARGET: &str = "DISTLOCK_BENCH_TARGET";
const WORKLOAD: &str = "DISTLOCK_BENCH_WORKLOAD";
const ROUND: &str = "DISTLOCK_BENCH_ROUND_US";
const SERVERS: &str = "DISTLOCK_BENCH_SERVER_PIDS";
/// The line prefix of a child's sample on its standard output.
const SAMPLE: &str = "DISTLOCK_BENCH_SAMPLE ";

/// One round of one subject in a process of its own: what the parent asked for.
pub struct Child {
    subject: String,
    target: String,
    workload: Workload,
    round: Duration,
    servers: Vec<u32>,
}

impl Child {
    /// The round this process is to run, when it is a child of a bench (`None` in the
    /// bench itself).
    pub fn from_env() -> Option<Child> {
        let subject = std::env::var(CHILD).ok()?;
        let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} unset"));
        Some(Child {
            subject,
            target: var(TARGET),
            workload: Workload::decode(&var(WORKLOAD)),
            round: Duration::from_micros(var(ROUND).parse().expect("round µs")),
            servers: var(SERVERS)
                .split(',')
                .filter_map(|p| p.parse().ok())
                .collect(),
        })
    }

    /// The subject's name.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// What the bench passed for the servers (a URL, or what its subjects need).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Runs the round on `s` (connected already) and prints its sample for the parent.
    pub async fn run<S: Subject>(&self, s: &Arc<S>) {
        let (c0, s0) = cpu_now(&server_processes(&self.servers));
        let mut sample = measure(s, self.workload, self.round).await;
        // Let background releases (dropped guards) finish inside the round whose CPU they
        // belong to.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let (c1, s1) = cpu_now(&server_processes(&self.servers));
        sample.client_cpu = c1 - c0;
        sample.server_cpu = s1 - s0;
        let doc = serde_json::json!({
            "cycles": sample.cycles, "elapsed_us": sample.elapsed.as_micros() as u64,
            "worst_wait_us": sample.worst_wait.as_micros() as u64,
            "held_us": sample.held.as_micros() as u64, "per_task": sample.per_task,
            "client_cpu": sample.client_cpu, "server_cpu": sample.server_cpu,
        });
        println!("{SAMPLE}{doc}");
    }
}

/// Runs one round of `subject` on `w` in a child process (this executable again) and
/// reads its sample.
fn run_child(subject: &str, target: &str, servers: &[u32], w: Workload, round: Duration) -> Sample {
    let exe = std::env::current_exe().expect("the bench's own executable");
    let pids: Vec<String> = servers.iter().map(u32::to_string).collect();
    let out = std::process::Command::new(exe)
        .env(CHILD, subject)
        .env(TARGET, target)
        .env(WORKLOAD, w.encode())
        .env(ROUND, round.as_micros().to_string())
        .env(SERVERS, pids.join(","))
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("start the {subject} child: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(SAMPLE))
        .unwrap_or_else(|| panic!("the {subject} child ({}) printed no sample", out.status));
    let doc: serde_json::Value = serde_json::from_str(line).expect("a sample");
    let num = |k: &str| doc[k].as_u64().unwrap_or(0);
    Sample {
        cycles: num("cycles"),
        elapsed: Duration::from_micros(num("elapsed_us")),
        worst_wait: Duration::from_micros(num("worst_wait_us")),
        held: Duration::from_micros(num("held_us")),
        per_task: doc["per_task"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
            .unwrap_or_default(),
        client_cpu: doc["client_cpu"].as_f64().unwrap_or(0.0),
        server_cpu: doc["server_cpu"].as_f64().unwrap_or(0.0),
    }
}

/// The server processes whose CPU a round counts: `roots` and the processes they forked
/// (PostgreSQL's backend per connection), read when asked.
fn server_processes(roots: &[u32]) -> Vec<u32> {
    let mut all = Vec::new();
    for &pid in roots {
        all.push(pid);
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        all.extend(
            children
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    all
}

/// CPU seconds (user + system) process `pid` used so far, from `/proc/<pid>/stat` (clock
/// ticks of 10 ms: precise enough summed over the rounds); 0 where unavailable.
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

/// Client (this process) and server CPU seconds so far, the servers given by their pids.
pub fn cpu_now(servers: &[u32]) -> (f64, f64) {
    (
        cpu_seconds(std::process::id()),
        servers.iter().map(|p| cpu_seconds(*p)).sum(),
    )
}

pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// One ratio the report gives: `num`'s rate over `den`'s, with the goal it should reach.
#[derive(Clone, Copy, Debug)]
pub struct Ratio {
    pub num: &'static str,
    pub den: &'static str,
    pub goal: Option<f64>,
}

/// `num / den`, to reach `goal` (None: reported only).
pub const fn ratio(num: &'static str, den: &'static str, goal: Option<f64>) -> Ratio {
    Ratio { num, den, goal }
}

/// A backend's whole benchmark: its subjects, the ratios it reports per workload, and what
/// it measured.
pub struct Bench {
    pub backend: &'static str,
    /// What the peers are, for the heading.
    pub peers: &'static str,
    pub subjects: Vec<Named>,
    /// What every child is given to reach the servers ([`Child::target`]).
    pub target: String,
    /// Server processes whose CPU is counted (with the processes they fork).
    pub servers: Vec<u32>,
    /// The subject whose lone cycle gives "one server write" (half its cycle) in the
    /// one-key bound; None: a write costs nothing (in-process).
    pub raw: Option<&'static str>,
    pub settings: Settings,
}

/// What one workload measured: per subject, its samples, one per round.
pub struct Measured {
    pub workload: Workload,
    pub samples: Vec<Vec<Sample>>,
}

impl Bench {
    /// Runs every workload: in each round every subject runs once, back to back, in an
    /// order that rotates from round to round (so no subject always follows another).
    /// `DISTLOCK_BENCH_WORKLOADS` (a list of `lone`, `distinct`, `one`) picks some only.
    pub async fn run(&self, workloads: &[Workload]) -> Vec<Measured> {
        let picked = std::env::var("DISTLOCK_BENCH_WORKLOADS").unwrap_or_default();
        let picked = |w: Workload| {
            let name = match w {
                Workload::Lone => "lone",
                Workload::Distinct(_) => "distinct",
                Workload::OneKey(..) => "one",
            };
            picked.is_empty() || picked.split(',').any(|p| p.trim() == name)
        };
        let mut all = Vec::new();
        for &w in workloads.iter().filter(|w| picked(**w)) {
            let mut samples = vec![Vec::new(); self.subjects.len()];
            for round in 0..self.settings.rounds {
                for k in 0..self.subjects.len() {
                    let i = (k + round) % self.subjects.len();
                    if !self.subjects[i].picked {
                        continue;
                    }
                    let (name, target, servers, round) = (
                        self.subjects[i].name,
                        self.target.clone(),
                        self.servers.clone(),
                        self.settings.round,
                    );
                    let sample = tokio::task::spawn_blocking(move || {
                        run_child(name, &target, &servers, w, round)
                    })
                    .await
                    .expect("the child's round");
                    samples[i].push(sample);
                }
            }
            all.push(Measured {
                workload: w,
                samples,
            });
        }
        all
    }

    fn index(&self, name: &str) -> usize {
        self.subjects
            .iter()
            .position(|s| s.name == name)
            .unwrap_or_else(|| panic!("no subject {name}"))
    }

    /// Prints the report and writes its JSON document; `ratios` gives each workload's
    /// ratios.
    pub fn report(&self, measured: &[Measured], ratios: impl Fn(Workload) -> Vec<Ratio>) {
        let mut doc_rows = Vec::new();
        let mut doc_ratios = Vec::new();
        let mut doc_one_key = Vec::new();
        println!(
            "\n== {}: distlock vs {} (medians of {} interleaved rounds of {:?} per subject) ==",
            self.backend, self.peers, self.settings.rounds, self.settings.round
        );
        let lone_write = self.raw.and_then(|raw| {
            let m = measured.iter().find(|m| m.workload == Workload::Lone)?;
            let rate = median(
                m.samples[self.index(raw)]
                    .iter()
                    .map(Sample::rate)
                    .collect(),
            );
            Duration::try_from_secs_f64(0.5 / rate).ok()
        });
        for m in measured {
            println!("{}:", m.workload.title());
            for (i, subject) in self.subjects.iter().enumerate() {
                let s = &m.samples[i];
                if s.is_empty() {
                    continue;
                }
                let rate = median(s.iter().map(Sample::rate).collect());
                let cycles: u64 = s.iter().map(|x| x.cycles).sum();
                let per_cycle = |secs: f64| secs * 1e6 / cycles.max(1) as f64;
                let client = per_cycle(s.iter().map(|x| x.client_cpu).sum());
                let server = per_cycle(s.iter().map(|x| x.server_cpu).sum());
                println!(
                    "  {:<13} {:>9.0} cycles/s   CPU per cycle: client {:>6.1} µs, server {:>6.1} µs",
                    subject.name, rate, client, server
                );
                doc_rows.push(serde_json::json!({
                    "workload": m.workload.title(), "subject": subject.name,
                    "cycles_per_sec": rate, "client_cpu_us": client, "server_cpu_us": server,
                }));
            }
            for r in ratios(m.workload) {
                let (a, b) = (&m.samples[self.index(r.num)], &m.samples[self.index(r.den)]);
                if a.is_empty() || b.is_empty() {
                    continue;
                }
                let value = median(a.iter().zip(b).map(|(x, y)| x.rate() / y.rate()).collect());
                let met = r.goal.map(|g| value >= g);
                let goal = match r.goal {
                    Some(g) => format!(" (goal >= {g:.2}: {})", pass(value >= g)),
                    None => String::new(),
                };
                println!("  {}/{} {value:.2}{goal}", r.num, r.den);
                doc_ratios.push(serde_json::json!({
                    "workload": m.workload.title(), "num": r.num, "den": r.den,
                    "ratio": value, "goal": r.goal, "met": met,
                }));
            }
            if let Workload::OneKey(tasks, configured_hold) = m.workload {
                let write = lone_write.unwrap_or(Duration::ZERO);
                for (i, subject) in self.subjects.iter().enumerate() {
                    let s = &m.samples[i];
                    if s.is_empty() {
                        continue;
                    }
                    // The hold as the timer delivered it (a 1 ms sleep takes longer).
                    let cycles: u64 = s.iter().map(|x| x.cycles).sum();
                    let hold = s.iter().map(|x| x.held).sum::<Duration>() / cycles.max(1) as u32;
                    let bound = (hold + write) * 2 * tasks as u32;
                    let worst = s.iter().map(|x| x.worst_wait).max().unwrap_or_default();
                    let spread = s
                        .iter()
                        .map(|x| {
                            let max = x.per_task.iter().max().copied().unwrap_or(0);
                            max - x.per_task.iter().min().copied().unwrap_or(0)
                        })
                        .max()
                        .unwrap_or(0);
                    // Back to back with no raw write to go by there is no bound to keep.
                    let ours =
                        subject.name.starts_with("ours") && !(configured_hold + write).is_zero();
                    let verdict = if ours {
                        format!(" (goal < {:.1} ms: {})", ms(bound), pass(worst < bound))
                    } else {
                        String::new()
                    };
                    println!(
                        "  {:<13} worst wait {:.1} ms{verdict}, mean hold {:.2} ms; per-task cycles differ by at most {spread} in a round",
                        subject.name,
                        ms(worst),
                        ms(hold),
                    );
                    doc_one_key.push(serde_json::json!({
                        "subject": subject.name, "worst_wait_ms": ms(worst),
                        "bound_ms": ms(bound), "mean_hold_ms": ms(hold), "met": ours.then_some(worst < bound),
                        "per_task_spread": spread,
                    }));
                }
                println!(
                    "  (bound: 2 x {tasks} tasks x (mean hold + one server write {:.3} ms, half the raw lone cycle))",
                    ms(write)
                );
            }
        }
        let doc = serde_json::json!({
            "backend": self.backend, "peers": self.peers,
            "rounds": self.settings.rounds, "round_ms": self.settings.round.as_millis() as u64,
            "rows": doc_rows, "ratios": doc_ratios, "one_key": doc_one_key,
        });
        let dir = std::env::var("DISTLOCK_BENCH_OUT").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench-ratios").to_owned()
        });
        let path = format!("{dir}/{}.json", self.backend);
        let written = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()));
        match written {
            Ok(()) => println!("(written to {path})"),
            Err(e) => eprintln!("could not write {path}: {e}"),
        }
    }
}

fn pass(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT MET"
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
