//! The commands' processes: stdin from /dev/null, output relayed with the job and the fire
//! time, the environment (the local fire time in, the lock server's URL out), the process
//! group stopped when a run ends, the command dying with distlock, SIGHUP's exit status
//! and, as PID 1, orphans reaped. Real processes throughout; `--url memory://` where one
//! process is enough.

use std::os::unix::process::ExitStatusExt;

use super::*;

/// `distlock cron FILE --url memory:// --replica only`, with `env` added, stdin a pipe the
/// test keeps open (a command inheriting it would block reading it), stdout and stderr
/// to files.
fn start(setup: &Setup, env: &[(&str, &str)]) -> (Replica, tokio::process::ChildStdin) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_distlock"));
    cmd.arg("cron")
        .arg(&setup.file)
        .args(["--url", "memory://", "--replica", "only"])
        .env_remove("DISTLOCK_URL")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(out_path(setup)).unwrap())
        .stderr(std::fs::File::create(err_path(setup)).unwrap())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn distlock cron");
    let stdin = child.stdin.take().expect("a stdin pipe");
    let replica = Replica {
        name: "only".to_owned(),
        child: Some(child),
        err: err_path(setup),
    };
    (replica, stdin)
}

fn out_path(setup: &Setup) -> PathBuf {
    setup.dir.path().join("only.out")
}

fn err_path(setup: &Setup) -> PathBuf {
    setup.dir.path().join("only.err")
}

/// `{log}` with `suffix` appended: a file beside the log.
fn beside(setup: &Setup, suffix: &str) -> PathBuf {
    PathBuf::from(format!("{}{suffix}", setup.log.display()))
}

/// Waits until `path` exists with a complete first line, and returns that line.
async fn first_line(path: &Path, limit: Duration) -> String {
    let text = common::read_when_written(path, limit).await;
    text.lines().next().unwrap_or_default().to_owned()
}

/// A command that leaves `sleep 25` running in its group (its pid appended to a file) and
/// exits 0 at once: the run's end stops the sleep; with `leave_children = true` it is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_child_is_stopped_when_the_run_ends_unless_left() {
    let setup = Setup::new(
        r#"
[[job]]
name = "spawner"
schedule = "*/2 * * * * *"
command = ["sh", "-c", "sleep 25 & echo $! >> {log}.stopped; echo started"]

[[job]]
name = "keeper"
schedule = "*/2 * * * * *"
leave_children = true
command = ["sh", "-c", "sleep 25 & echo $! >> {log}.kept; echo started"]
"#,
    );
    let (mut replica, _stdin) = start(&setup, &[]);
    let stopped: i32 = first_line(&beside(&setup, ".stopped"), PROMPT)
        .await
        .parse()
        .expect("a pid");
    let kept: i32 = first_line(&beside(&setup, ".kept"), PROMPT)
        .await
        .parse()
        .expect("a pid");
    // SIGTERM reaches the sleep at once; it would otherwise run 25 s.
    assert_gone(stopped, Duration::from_secs(8)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        common::alive(kept),
        "leave_children = true keeps the sleep {kept}: {}",
        replica.stderr()
    );
    let stderr = replica.stderr();
    assert!(
        stderr.contains("\"spawner\"") && stderr.contains("leaving processes in its group"),
        "{stderr}"
    );
    assert!(
        !stderr
            .lines()
            .any(|l| l.contains("keeper") && l.contains("leaving processes")),
        "{stderr}"
    );
    replica.terminate(PROMPT).await;
    // Left alone by the run; the test cleans up after itself.
    for line in std::fs::read_to_string(beside(&setup, ".kept"))
        .unwrap_or_default()
        .lines()
    {
        if let Ok(pid) = line.parse::<i32>() {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// A command reading stdin (`cat`) ends at once: its stdin is /dev/null, not distlock's
/// (here a pipe the test keeps open, which would block it for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_reading_stdin_gets_end_of_file_at_once() {
    let setup = Setup::new(
        r#"
[[job]]
name = "reader"
schedule = "* * * * * *"
command = ["sh", "-c", "cat; echo \"cat ended $?\" >> {log}.cat"]
"#,
    );
    let (mut replica, stdin) = start(&setup, &[]);
    let line = first_line(&beside(&setup, ".cat"), Duration::from_secs(10)).await;
    assert_eq!(line, "cat ended 0");
    replica.terminate(PROMPT).await;
    drop(stdin);
}

/// The command's environment: the fire time in the job's zone (RFC 3339 with the offset,
/// the same instant as DISTLOCK_SCHEDULED_AT) and the zone's name; DISTLOCK_URL and
/// DISTLOCK_METRICS_PUSH removed, other variables passed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_gets_the_local_fire_time_and_not_the_url() {
    let setup = Setup::new(
        r#"
time_zone = "Europe/Berlin"
[[job]]
name = "zoned"
schedule = "* * * * * *"
command = ["sh", "-c", "env > {log}.tmp.$$ && mv {log}.tmp.$$ {log}.env"]
"#,
    );
    let (mut replica, _stdin) = start(
        &setup,
        &[
            ("DISTLOCK_URL", "redis://:hunter2@127.0.0.1:1"),
            ("DISTLOCK_METRICS_PUSH", "http://user:hunter2@127.0.0.1:1"),
            ("DISTLOCK_TEST_PASSED_ON", "yes"),
        ],
    );
    common::read_when_written(&beside(&setup, ".env"), PROMPT).await;
    replica.terminate(PROMPT).await;
    let text = std::fs::read_to_string(beside(&setup, ".env")).unwrap();
    let env: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    assert!(
        !text.contains("hunter2"),
        "a password reached the command: {text}"
    );
    assert!(!env.contains_key("DISTLOCK_URL"), "{text}");
    assert!(!env.contains_key("DISTLOCK_METRICS_PUSH"), "{text}");
    assert_eq!(env.get("DISTLOCK_TEST_PASSED_ON"), Some(&"yes"), "{text}");
    assert_eq!(
        env.get("DISTLOCK_TIME_ZONE"),
        Some(&"Europe/Berlin"),
        "{text}"
    );
    let at: jiff::Timestamp = env["DISTLOCK_SCHEDULED_AT"].parse().unwrap();
    let local = env["DISTLOCK_SCHEDULED_LOCAL"];
    let berlin = at.to_zoned(jiff::tz::TimeZone::get("Europe/Berlin").unwrap());
    // RFC 3339 with Berlin's offset at that instant (+01:00 or +02:00), no zone name.
    let expected = format!(
        "{}{}",
        berlin.strftime("%Y-%m-%dT%H:%M:%S"),
        berlin.strftime("%:z")
    );
    assert_eq!(local, expected, "{text}");
    assert!(!local.ends_with('Z') && !local.contains('['), "{local}");
    let parsed: jiff::Timestamp = local.parse().unwrap();
    assert_eq!(parsed, at, "the same instant");
}

/// Each line of the command's stdout is on distlock's stdout, each line of its stderr on
/// distlock's stderr, after `[JOB FIRE-TIME] `.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_lines_carry_the_job_and_the_fire_time() {
    let setup = Setup::new(
        r#"
[[job]]
name = "talker"
schedule = "* * * * * *"
command = ["sh", "-c", "echo out-line; echo err-line >&2; printf 'no newline'"]
"#,
    );
    let (mut replica, _stdin) = start(&setup, &[]);
    let deadline = Instant::now() + PROMPT;
    while !std::fs::read_to_string(out_path(&setup))
        .unwrap_or_default()
        .contains("] no newline\n")
    {
        assert!(Instant::now() < deadline, "no output: {}", replica.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    replica.terminate(PROMPT).await;
    let stdout = std::fs::read_to_string(out_path(&setup)).unwrap();
    let stderr = replica.stderr();
    let prefixed = |text: &str, what: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.ends_with(&format!("] {what}")))
            .map(|l| {
                let inner = l
                    .strip_prefix("[talker ")
                    .and_then(|rest| rest.strip_suffix(&format!("] {what}")))
                    .unwrap_or_else(|| panic!("not prefixed: {l:?}"));
                epoch_secs(inner);
                inner.to_owned()
            })
            .collect()
    };
    let outs = prefixed(&stdout, "out-line");
    let errs = prefixed(&stderr, "err-line");
    assert!(!outs.is_empty(), "{stdout}");
    assert!(!errs.is_empty(), "{stderr}");
    assert!(errs.iter().all(|t| outs.contains(t)), "the same fire times");
    assert!(!stdout.contains("err-line"), "{stdout}");
    assert!(!stderr.contains("out-line"), "{stderr}");
    assert_eq!(
        prefixed(&stdout, "no newline").len(),
        outs.len(),
        "{stdout}"
    );
}

/// A failed run's record keeps the end of the command's output (stdout and stderr) beside
/// the exit status, on one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_s_record_keeps_the_end_of_its_output() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start().await;
    let url = server.url();
    let setup = Setup::new(
        r#"
[[job]]
name = "failing"
schedule = "*/2 * * * * *"
command = ["sh", "-c", "seq 1 2000; sleep 0.2; echo 'disk full' >&2; exit 3"]
"#,
    );
    let mut replica = setup.replica(&url, "only", &[]);
    let deadline = Instant::now() + PROMPT;
    let detail = loop {
        let status = setup.status(&url).await;
        let failed = job(&status, "failing")["fire_times"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["outcome"] == "failed")
            .map(|r| r["detail"].as_str().unwrap_or_default().to_owned());
        if let Some(detail) = failed {
            break detail;
        }
        assert!(Instant::now() < deadline, "no failed run: {status:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    replica.terminate(PROMPT).await;
    assert!(
        detail.starts_with("exit status 3; output ends \""),
        "{detail}"
    );
    // The streams are relayed apart; the sleep puts stderr's line after stdout's.
    assert!(detail.ends_with("1999\\n2000\\ndisk full\\n\""), "{detail}");
    assert!(!detail.contains("\\n1\\n2\\n"), "only the end: {detail}");
    assert!(
        detail.len() <= distlock::records::MAX_DETAIL_LEN,
        "{detail}"
    );
}

/// SIGKILL to distlock kills its running command too (its parent-death signal), instead
/// of leaving it to run while the lock expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_distlock_takes_its_command_with_it() {
    let setup = Setup::new(
        r#"
[[job]]
name = "long"
schedule = "*/2 * * * * *"
command = ["sh", "-c", "echo $$ > {log}.pid; exec sleep 60"]
"#,
    );
    let (mut replica, _stdin) = start(&setup, &[]);
    let pid: i32 = first_line(&beside(&setup, ".pid"), PROMPT)
        .await
        .parse()
        .expect("a pid");
    assert!(common::alive(pid));
    let status = replica.stop(libc::SIGKILL, PROMPT).await;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert_gone(pid, Duration::from_secs(5)).await;
}

/// SIGHUP: the same clean shutdown, then exit 129 (a supervisor restarting on failure
/// starts it again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_exits_129() {
    let setup = Setup::new(
        r#"
[[job]]
name = "j"
schedule = "every 1h"
command = ["true"]
"#,
    );
    let (mut replica, _stdin) = start(&setup, &[]);
    let deadline = Instant::now() + PROMPT;
    while !replica.stderr().contains("cron: 1 job(s)") {
        assert!(Instant::now() < deadline, "{}", replica.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = replica.stop(libc::SIGHUP, PROMPT).await;
    assert_eq!(status.code(), Some(129), "{}", replica.stderr());
    assert!(replica.stderr().contains("SIGHUP"), "{}", replica.stderr());
}

/// `(pid, ppid, state, comm)` of every process.
fn processes() -> Vec<(i32, i32, char, String)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_owned();
        let mut rest = stat[close + 1..].split_whitespace();
        let state = rest.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid = rest.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        all.push((pid, ppid, state, comm));
    }
    all
}

/// As PID 1 of a PID namespace (`unshare --pid --fork --mount-proc`, the stand-in for a
/// container), `distlock cron` reaps the orphans reparented to it (a `sleep 1 &` its
/// command left, with leave_children so that it ends by itself), and its own commands'
/// exit statuses still reach their runs (a job exiting 3 is recorded so, not as a wait
/// that failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid_1_it_reaps_orphans_and_keeps_its_commands_statuses() {
    let setup = Setup::new(
        r#"
[[job]]
name = "orphaner"
schedule = "* * * * * *"
leave_children = true
command = ["sh", "-c", "sleep 1 & exit 0"]

[[job]]
name = "three"
schedule = "* * * * * *"
command = ["sh", "-c", "exit 3"]
"#,
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(env!("CARGO_BIN_EXE_distlock"))
        .arg("cron")
        .arg(&setup.file)
        .args(["--url", "memory://", "--replica", "only"])
        .env_remove("DISTLOCK_URL")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(out_path(&setup)).unwrap())
        .stderr(std::fs::File::create(err_path(&setup)).unwrap())
        .kill_on_drop(true);
    let mut unshare = cmd
        .spawn()
        .expect("unshare (util-linux) runs distlock as PID 1 of a new PID namespace");
    let unshare_pid = i32::try_from(unshare.id().unwrap()).unwrap();
    let stderr = || std::fs::read_to_string(err_path(&setup)).unwrap_or_default();
    let deadline = Instant::now() + PROMPT;
    let init = loop {
        if let Some(p) = processes().iter().find(|p| p.1 == unshare_pid) {
            break p.0;
        }
        assert!(Instant::now() < deadline, "no distlock: {}", stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Orphaned sleeps, reparented to distlock; each must be gone from /proc (reaped, not
    // a zombie) soon after it ended.
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        for (pid, ppid, _, comm) in processes() {
            if ppid == init && comm == "sleep" {
                seen.insert(pid);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        seen.len() >= 2,
        "orphaned sleeps reparented to distlock: {seen:?}\n{}",
        stderr()
    );
    // Each of them ended a second after it started: still a child of distlock, it would
    // be a zombie nobody reaped.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lingering: Vec<_> = processes()
        .into_iter()
        .filter(|p| seen.contains(&p.0) && p.1 == init && p.3 == "sleep")
        .collect();
    common::kill(u32::try_from(init).unwrap(), libc::SIGTERM);
    let status = tokio::time::timeout(PROMPT, unshare.wait())
        .await
        .expect("distlock stops on SIGTERM")
        .unwrap();
    let stderr = stderr();
    assert!(lingering.is_empty(), "not reaped: {lingering:?}\n{stderr}");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("exit status 3"), "{stderr}");
    assert!(
        !stderr.contains("waiting for the command failed"),
        "{stderr}"
    );
    assert!(
        !stderr
            .lines()
            .any(|l| l.contains("orphaner") && l.contains("did not succeed")),
        "{stderr}"
    );
}
