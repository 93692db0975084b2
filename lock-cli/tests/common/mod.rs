//! Helpers shared by the integration tests: running the built `distlock` binary with a
//! time limit, and watching the processes it starts.
#![allow(dead_code)]

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// A `distlock` command with the given arguments, not influenced by the caller's
/// `DISTLOCK_*` variables (flags read them), `RUST_LOG` or `COLUMNS`, with stdin closed and
/// stdout/stderr captured.
pub fn distlock<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_distlock"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("DISTLOCK_") {
            cmd.env_remove(name);
        }
    }
    cmd.args(args)
        // `distlock run`'s default file lock in a directory of this test binary's own.
        .env("XDG_RUNTIME_DIR", runtime_dir())
        .env_remove("RUST_LOG")
        .env_remove("COLUMNS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// A `distlock` command as [`distlock`] makes it, with libfaketime preloaded so that its
/// wall clock, and that of every process it starts, is moved by `offset` (faketime's
/// syntax: `"+1h"`, `"-1h"`); the monotonic clock is left alone. The stand-in for a host
/// whose clock is wrong. The library is preloaded into distlock itself (no `faketime`
/// wrapper process), so the child is distlock.
///
/// # Panics
/// When libfaketime is not installed, with the command that installs it.
/// The `XDG_RUNTIME_DIR` of the commands this test binary starts: under cargo's directory
/// for tests' files, one per test process, so that `distlock run` without a URL (a file
/// lock in `$XDG_RUNTIME_DIR/distlock`) never meets another binary's or the user's locks.
pub fn runtime_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("xdg-runtime-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the runtime directory");
        dir
    })
}

pub fn skewed<I, S>(offset: &str, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = distlock(args);
    cmd.env("LD_PRELOAD", libfaketime())
        .env("FAKETIME", offset)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    cmd
}

/// libfaketime's thread-safe library, wherever Debian's `faketime` package put it.
fn libfaketime() -> std::path::PathBuf {
    let dirs = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime"))
        .chain([
            std::path::PathBuf::from("/usr/lib/faketime"),
            "/usr/local/lib/faketime".into(),
        ]);
    dirs.map(|d| d.join("libfaketimeMT.so.1"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("libfaketime not found: install it with: sudo apt-get install -y faketime")
        })
}

/// How a `distlock` process ended.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// From spawning until it exited.
    pub elapsed: Duration,
}

impl Finished {
    /// The exit code; panics (with the output) when the process died of a signal.
    pub fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("distlock died of a signal: {self:#?}"))
    }

    /// Asserts the exit code, showing the output when it differs.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(self.status.code(), Some(code), "unexpected exit: {self:#?}");
        self
    }

    /// Asserts that stderr mentions `needle`.
    pub fn expect_stderr(&self, needle: &str) -> &Self {
        assert!(
            self.stderr.contains(needle),
            "stderr should mention {needle:?}: {self:#?}"
        );
        self
    }
}

/// Runs `cmd` to its end; panics if it takes longer than `limit` (the process is killed).
pub async fn finish(mut cmd: Command, limit: Duration) -> Finished {
    let started = Instant::now();
    let child = cmd.spawn().expect("spawn distlock");
    collect(child, started, limit).await
}

/// Waits for a spawned `distlock` with a time limit and collects its output.
pub async fn collect(child: Child, started: Instant, limit: Duration) -> Finished {
    let output = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("distlock did not finish within {limit:?}"))
        .expect("wait for distlock");
    Finished {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        elapsed: started.elapsed(),
    }
}

/// Waits until `path` holds a complete line and returns the text; panics after `limit`.
pub async fn read_when_written(path: &Path, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} was not written within {limit:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The pid a test command wrote (`echo $$ > file`).
pub async fn read_pid(path: &Path, limit: Duration) -> i32 {
    let text = read_when_written(path, limit).await;
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a pid: {text:?}"))
}

/// Whether `pid` is a running process (a zombie counts as gone: it runs nothing).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may contain spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Asserts that `pid` is gone within `limit` (it may still be reaped by its new parent).
pub async fn assert_gone(pid: i32, limit: Duration) {
    let deadline = Instant::now() + limit;
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "process {pid} is still running after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends `sig` to `pid`.
pub fn kill(pid: u32, sig: i32) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
}

/// `run KEY --url URL EXTRA… -- sh -c SCRIPT`.
pub fn run_args(url: &str, key: &str, extra: &[&str], script: &str) -> Vec<String> {
    let mut args: Vec<String> = vec!["run".into(), key.into(), "--url".into(), url.into()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--".into());
    args.extend(sh(script));
    args
}

/// A `distlock run` whose command records its pid and fence, then sleeps.
pub struct Sleeper {
    pub child: Child,
    pub started: Instant,
    /// The command's pid.
    pub pid: i32,
    /// The command's DISTLOCK_FENCE.
    pub fence: u64,
    _dir: tempfile::TempDir,
}

impl Sleeper {
    /// Starts it and returns once the command runs (so the lock is held).
    pub async fn start(url: &str, key: &str, extra: &[&str]) -> Sleeper {
        Self::start_with(url, key, extra, distlock).await
    }

    /// As [`start`](Self::start), with the `distlock` command made by `command` from its
    /// arguments (for example [`skewed`]).
    pub async fn start_with(
        url: &str,
        key: &str,
        extra: &[&str],
        command: impl FnOnce(Vec<String>) -> Command,
    ) -> Sleeper {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pid-fence");
        let started = Instant::now();
        let child = command(run_args(
            url,
            key,
            extra,
            &format!(
                "echo \"$$ $DISTLOCK_FENCE\" > {}; exec sleep 60",
                file.display()
            ),
        ))
        .spawn()
        .unwrap();
        let text = read_when_written(&file, PROMPT).await;
        let (pid, fence) = text.trim().split_once(' ').expect("pid and fence");
        Sleeper {
            child,
            started,
            pid: pid.parse().unwrap(),
            fence: fence.parse().unwrap(),
            _dir: dir,
        }
    }

    /// Waits for distlock to end.
    pub async fn finish(self) -> Finished {
        collect(self.child, self.started, PROMPT).await
    }

    /// distlock must notice the lock is lost, stop the command and exit 76.
    pub async fn expect_lost(self, key: &str) -> Finished {
        let pid = self.pid;
        let out = self.finish().await;
        out.expect_code(76)
            .expect_stderr(&format!("lost lock {key:?}"));
        assert_gone(pid, Duration::from_secs(5)).await;
        out
    }

    /// SIGTERM to distlock; it must die of it after stopping the command.
    pub async fn terminate(self) {
        kill(self.child.id().unwrap(), libc::SIGTERM);
        let pid = self.pid;
        let out = self.finish().await;
        assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{out:#?}");
        assert_gone(pid, Duration::from_secs(5)).await;
    }
}

/// A shell command line for `sh -c`.
pub fn sh(script: &str) -> [String; 3] {
    ["sh".to_owned(), "-c".to_owned(), script.to_owned()]
}

/// Generous upper bound for a `distlock` process that should end promptly.
pub const PROMPT: Duration = Duration::from_secs(20);

fn count(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Checks one `bench --json` result: at least one cycle, and the counts add up.
pub fn check_bench_counts(r: &serde_json::Value) {
    let per_task: Vec<u64> = r["per_task_cycles"]
        .as_array()
        .unwrap_or_else(|| panic!("per_task_cycles: {r}"))
        .iter()
        .map(count)
        .collect();
    assert_eq!(per_task.len() as u64, count(&r["tasks"]), "{r}");
    let cycles = count(&r["cycles"]);
    assert!(cycles > 0, "{r}");
    assert_eq!(per_task.iter().sum::<u64>(), cycles, "{r}");
    assert_eq!(
        count(&r["min_task_cycles"]),
        *per_task.iter().min().unwrap()
    );
    assert_eq!(
        count(&r["max_task_cycles"]),
        *per_task.iter().max().unwrap()
    );
    // Every grant is released once: a failed release is a grant without a cycle.
    assert_eq!(
        count(&r["acquire"]["count"]),
        cycles + count(&r["release_errors"]),
        "{r}"
    );
    assert_eq!(count(&r["release"]["count"]), cycles, "{r}");
    assert_eq!(
        count(&r["errors"]),
        count(&r["acquire_errors"]) + count(&r["release_errors"]),
        "{r}"
    );
    let rate = r["cycles_per_sec"].as_f64().unwrap();
    let elapsed = r["elapsed_s"].as_f64().unwrap();
    assert!((rate * elapsed - cycles as f64).abs() < 1.0, "{r}");
    let a = &r["acquire"];
    assert!(count(&a["p50_ns"]) <= count(&a["p90_ns"]), "{r}");
    assert!(count(&a["p90_ns"]) <= count(&a["p99_ns"]), "{r}");
    assert!(count(&a["p99_ns"]) <= count(&a["max_ns"]), "{r}");
    // HDR reports the top of the max's bucket (3 significant digits).
    assert!(
        count(&r["worst_wait_ns"]) as f64 >= count(&a["max_ns"]) as f64 * 0.99,
        "{r}"
    );
    let jain = r["fairness_jain"].as_f64().unwrap();
    let n = per_task.len() as f64;
    assert!(jain >= 1.0 / n - 1e-9 && jain <= 1.0 + 1e-9, "{r}");
}

/// What every cross-process backend must do under `distlock`: while one `run` holds KEY,
/// `--no-wait` exits 75 and `status` shows the holder's fence; once the holder is stopped
/// by SIGTERM the key is free and the next run's fence is greater.
pub async fn cross_process_scenario(url: &str, backend: &str) {
    let holder = Sleeper::start(url, "shared", &[]).await;
    let out = finish(
        distlock(run_args(url, "shared", &["--no-wait"], "true")),
        PROMPT,
    )
    .await;
    out.expect_code(75).expect_stderr("held by another owner");
    assert!(
        !out.stderr.contains("note:"),
        "{backend} is cross-process: {out:#?}"
    );

    let status = finish(
        distlock(["status", "shared", "--url", url, "--json"]),
        PROMPT,
    )
    .await;
    status.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&status.stdout).expect("status --json");
    assert_eq!(v["backend"], backend, "{v}");
    assert_eq!(v["held"], true, "{v}");
    if let Some(fence) = v["fence"].as_u64() {
        assert_eq!(fence, holder.fence, "{v}");
    }

    let first = holder.fence;
    holder.terminate().await;
    let next = finish(
        distlock(run_args(
            url,
            "shared",
            &["--no-wait"],
            "echo $DISTLOCK_FENCE",
        )),
        PROMPT,
    )
    .await;
    next.expect_code(0);
    let second: u64 = next.stdout.trim().parse().expect("a fence");
    assert!(second > first, "fences {first} then {second}");
}

/// Checks the raw baseline of a `bench --json` document on `url`: one entry per server, the
/// one of `url` with the baseline `measured` in one run per number of `tasks`, each with
/// cycles, counts that add up and no error; and every workload on that server with its
/// `lock_over_raw` ratio (raw cycles/s over the workload's).
pub fn check_bench_baseline(doc: &serde_json::Value, url: &str, measured: &str, tasks: &[u64]) {
    let servers = doc["servers"].as_array().expect("servers");
    // Reports show URLs with the password hidden.
    let shown = distlock::url::redact(url);
    let server = servers
        .iter()
        .find(|s| s["url"] == shown.as_str())
        .unwrap_or_else(|| panic!("no server {url}: {doc}"));
    let baseline = &server["baseline"];
    assert_eq!(baseline["measured"], measured, "{server}");
    let runs = baseline["runs"].as_array().expect("runs");
    let run_tasks: Vec<u64> = runs.iter().map(|r| count(&r["tasks"])).collect();
    assert_eq!(run_tasks, tasks, "{server}");
    for run in runs {
        let cycles = count(&run["cycles"]);
        assert!(cycles > 0, "{run}");
        let rate = run["cycles_per_sec"].as_f64().unwrap();
        assert!(rate > 0.0, "{run}");
        let elapsed = run["elapsed_s"].as_f64().unwrap();
        assert!((rate * elapsed - cycles as f64).abs() < 1.0, "{run}");
        let c = &run["cycle"];
        assert_eq!(count(&c["count"]), cycles, "{run}");
        assert!(count(&c["p50_ns"]) > 0, "{run}");
        assert!(count(&c["p50_ns"]) <= count(&c["p99_ns"]), "{run}");
        assert_eq!(count(&run["errors"]), 0, "{run}");
    }
    assert_eq!(count(&doc["baseline_errors"]), 0, "{doc}");
    for r in doc["results"].as_array().unwrap() {
        if r["url"] != url {
            continue;
        }
        let raw = runs
            .iter()
            .find(|run| run["tasks"] == r["tasks"])
            .expect("a raw run with the workload's tasks");
        let ratio = r["lock_over_raw"]
            .as_f64()
            .unwrap_or_else(|| panic!("no lock_over_raw: {r}"));
        let expected =
            raw["cycles_per_sec"].as_f64().unwrap() / r["cycles_per_sec"].as_f64().unwrap();
        assert!((ratio - expected).abs() < 1e-9 * expected, "{r}");
    }
}

/// `bench` on `url` beside memory://: with `--json` the server's raw baseline is `measured`
/// (one run per number of tasks, see [`check_bench_baseline`]) and memory's is null; the
/// tables show the raw rows beside the lock's and name what was measured.
pub async fn bench_baseline_scenario(url: &str, backend: &str, measured: &str) {
    let out = finish(
        distlock([
            "bench",
            "--url",
            "memory://",
            "--url",
            url,
            "--tasks",
            "1,2",
            "--keys",
            "distinct",
            "--duration",
            "200ms",
            "--json",
        ]),
        Duration::from_secs(60),
    )
    .await;
    out.expect_code(0);
    let doc: serde_json::Value = serde_json::from_str(&out.stdout).expect("bench --json");
    assert_eq!(doc["settings"]["baseline"], true, "{doc}");
    let servers = doc["servers"].as_array().expect("servers");
    assert_eq!(servers.len(), 2, "{doc}");
    assert_eq!(servers[0]["url"], "memory://");
    assert_eq!(servers[0]["baseline"], serde_json::Value::Null, "{doc}");
    assert_eq!(servers[1]["backend"], backend, "{doc}");
    check_bench_baseline(&doc, url, measured, &[1, 2]);
    for r in doc["results"].as_array().unwrap() {
        check_bench_counts(r);
        if r["url"] == "memory://" {
            assert_eq!(r["lock_over_raw"], serde_json::Value::Null, "{r}");
        }
    }

    let text = finish(
        distlock([
            "bench",
            "--url",
            "memory://",
            "--url",
            url,
            "--tasks",
            "2",
            "--keys",
            "one",
            "--duration",
            "200ms",
        ]),
        Duration::from_secs(60),
    )
    .await;
    text.expect_code(0);
    for needle in [
        "raw baseline on",
        "raw cycles/s",
        "lock cycle / raw",
        "raw cycle p50",
        "raw cycle p99",
        "raw errors",
        "raw server round trips:",
        &format!("{}: {measured}", distlock::url::redact(url)),
        "memory://: none (no server to measure)",
    ] {
        assert!(
            text.stdout.contains(needle),
            "tables lack {needle:?}: {text:#?}"
        );
    }
    let ratio = text
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("lock cycle / raw"))
        .expect("the ratio row");
    // memory has no baseline, the server has one.
    assert!(
        ratio.contains(" - ") && ratio.trim_end().ends_with('x'),
        "{ratio}"
    );
}

/// A free loopback port that no test-kit server will be given meanwhile.
pub fn free_port() -> u16 {
    lock_testkit::unused_port()
}

/// GET /metrics of a Prometheus endpoint; `None` while it does not answer yet.
pub async fn scrape(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.ok()?;
    let (head, body) = body.split_once("\r\n\r\n")?;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    Some(body.to_owned())
}
