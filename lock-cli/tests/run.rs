//! `distlock run` on the in-process backend: the command's life cycle, its environment
//! and its exit statuses; and its default, a file lock that excludes between the
//! `distlock` processes of this host. Exclusion between hosts needs a lock server: see
//! redis.rs.

mod common;

use std::ffi::OsStr;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::{assert_gone, collect, distlock, finish, read_pid, read_when_written, sh, PROMPT};

fn run_args(extra: &[&str], script: &str) -> Vec<String> {
    let mut args: Vec<String> = vec!["run".into(), "job".into()];
    if !extra.contains(&"--url") {
        args.extend(["--url".into(), "memory://".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--".into());
    args.extend(sh(script));
    args
}

/// The command's exit code is distlock's exit code.
#[tokio::test]
async fn exit_code_passes_through() {
    for code in [0, 3, 42] {
        let out = finish(distlock(run_args(&[], &format!("exit {code}"))), PROMPT).await;
        out.expect_code(code);
    }
}

/// A command killed by signal N makes distlock exit 128 + N.
#[tokio::test]
async fn signal_death_is_128_plus_signal() {
    let out = finish(distlock(run_args(&[], "kill -9 $$")), PROMPT).await;
    out.expect_code(128 + 9);
}

/// The command sees DISTLOCK_KEY and DISTLOCK_FENCE; stdout is the command's own.
#[tokio::test]
async fn key_and_fence_reach_the_command() {
    let out = finish(
        distlock(run_args(&[], "echo \"$DISTLOCK_KEY|$DISTLOCK_FENCE\"")),
        PROMPT,
    )
    .await;
    out.expect_code(0);
    let (key, fence) = out.stdout.trim().split_once('|').expect("two fields");
    assert_eq!(key, "job");
    fence.parse::<u64>().expect("DISTLOCK_FENCE is a number");
}

/// memory:// runs the command but says on stderr that it excludes nothing across
/// processes.
#[tokio::test]
async fn memory_backend_warns_that_it_is_in_process_only() {
    let out = finish(distlock(run_args(&["--no-wait"], "true")), PROMPT).await;
    out.expect_code(0)
        .expect_stderr("exclude only inside this distlock process");
}

/// --timeout stops the command with SIGTERM: exit 124, the command gone, promptly.
#[tokio::test]
async fn timeout_terminates_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let out = finish(
        distlock(run_args(&["--timeout", "300ms", "--grace", "20s"], &script)),
        PROMPT,
    )
    .await;
    out.expect_code(124).expect_stderr("--timeout 300ms");
    // SIGTERM sufficed: no waiting for the 20 s grace.
    assert!(out.elapsed < Duration::from_secs(10), "{out:#?}");
    assert!(out.elapsed >= Duration::from_millis(300), "{out:#?}");
    let pid = read_pid(&pid_file, PROMPT).await;
    assert_gone(pid, Duration::from_secs(5)).await;
}

/// A command that ignores SIGTERM is killed once --grace has passed, not before.
#[tokio::test]
async fn grace_then_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let script = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        pid_file.display()
    );
    let out = finish(
        distlock(run_args(
            &["--timeout", "300ms", "--grace", "700ms"],
            &script,
        )),
        PROMPT,
    )
    .await;
    out.expect_code(124);
    assert!(out.elapsed >= Duration::from_millis(1000), "{out:#?}");
    assert!(out.elapsed < Duration::from_secs(10), "{out:#?}");
    let pid = read_pid(&pid_file, PROMPT).await;
    assert_gone(pid, Duration::from_secs(5)).await;
}

/// SIGTERM to distlock reaches the command, which exits; distlock then dies of SIGTERM.
#[tokio::test]
async fn sigterm_is_forwarded_and_distlock_exits() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let marker = dir.path().join("marker");
    let script = format!(
        "trap 'echo got-term > {}; exit 0' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        marker.display(),
        ready.display()
    );
    let started = Instant::now();
    let child = distlock(run_args(&["--grace", "20s"], &script))
        .spawn()
        .unwrap();
    let pid = read_pid(&ready, PROMPT).await;
    common::kill(child.id().unwrap(), libc::SIGTERM);
    let out = collect(child, started, PROMPT).await;
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{out:#?}");
    assert_eq!(
        read_when_written(&marker, PROMPT).await.trim(),
        "got-term",
        "the command saw SIGTERM"
    );
    assert_gone(pid, Duration::from_secs(5)).await;
}

/// A second signal to distlock does not wait for --grace: the command is killed at once.
#[tokio::test]
async fn second_signal_kills_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!(
        "trap '' INT TERM; echo $$ > {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let started = Instant::now();
    let child = distlock(run_args(&["--grace", "60s"], &script))
        .spawn()
        .unwrap();
    let pid = read_pid(&ready, PROMPT).await;
    let distlock_pid = child.id().unwrap();
    common::kill(distlock_pid, libc::SIGINT);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(common::alive(pid), "the command ignores SIGINT");
    common::kill(distlock_pid, libc::SIGINT);
    let out = collect(child, started, PROMPT).await;
    assert_eq!(out.status.signal(), Some(libc::SIGINT), "{out:#?}");
    assert!(out.elapsed < Duration::from_secs(30), "{out:#?}");
    assert_gone(pid, Duration::from_secs(5)).await;
}

/// A program that does not exist is 127, one that cannot be executed 126.
#[tokio::test]
async fn unrunnable_commands() {
    let out = finish(
        distlock(["run", "job", "--", "/nonexistent/program"]),
        PROMPT,
    )
    .await;
    out.expect_code(127).expect_stderr("command not found");
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    let out = finish(
        distlock([
            OsStr::new("run"),
            OsStr::new("job"),
            OsStr::new("--"),
            plain.as_os_str(),
        ]),
        PROMPT,
    )
    .await;
    out.expect_code(126).expect_stderr("permission denied");
}

/// `--at-least` keeps the lock (and distlock) until that long after the start, however
/// quickly the command ended.
#[tokio::test]
async fn at_least_holds_past_a_quick_command() {
    let out = finish(
        distlock(run_args(
            &["--url", "memory://", "--at-least", "1500ms"],
            "true",
        )),
        PROMPT,
    )
    .await;
    out.expect_code(0);
    assert!(out.elapsed >= Duration::from_millis(1500), "{out:#?}");
}

/// `--schedule` gives the command the fire time it claimed, RFC 3339 in UTC, a whole
/// second not after now.
#[tokio::test]
async fn a_scheduled_run_sees_its_fire_time() {
    let out = finish(
        distlock(run_args(
            &[
                "--url",
                "memory://",
                "--schedule",
                "every 1s",
                "--lateness",
                "1s",
            ],
            "echo $DISTLOCK_SCHEDULED_AT",
        )),
        PROMPT,
    )
    .await;
    out.expect_code(0);
    let at = out.stdout.trim();
    assert!(at.ends_with('Z'), "{out:#?}");
    let t: jiff::Timestamp = at.parse().expect("RFC 3339");
    assert_eq!(t.subsec_nanosecond(), 0, "{at}");
    assert!(t <= jiff::Timestamp::now(), "{at}");
}

/// With `--time-zone`, the command also gets the fire time in that zone (RFC 3339 with
/// its offset, the same instant) and the zone's name.
#[tokio::test]
async fn a_scheduled_run_sees_its_local_fire_time() {
    let out = finish(
        distlock(run_args(
            &[
                "--url",
                "memory://",
                "--schedule",
                "* * * * * *",
                "--time-zone",
                "Asia/Kolkata",
                "--lateness",
                "1s",
            ],
            "echo \"$DISTLOCK_SCHEDULED_AT|$DISTLOCK_SCHEDULED_LOCAL|$DISTLOCK_TIME_ZONE\"",
        )),
        PROMPT,
    )
    .await;
    out.expect_code(0);
    let fields: Vec<&str> = out.stdout.trim().split('|').collect();
    let [at, local, zone] = fields[..] else {
        panic!("three fields: {out:#?}");
    };
    assert_eq!(zone, "Asia/Kolkata");
    assert!(local.ends_with("+05:30"), "{local}");
    let at: jiff::Timestamp = at.parse().unwrap();
    let local: jiff::Timestamp = local.parse().expect("RFC 3339");
    assert_eq!(at, local);
}

/// DISTLOCK_URL (which may carry a password) does not reach the command; other variables
/// do.
#[tokio::test]
async fn the_url_does_not_reach_the_command() {
    let mut cmd = distlock(run_args(&[], "env"));
    cmd.env("DISTLOCK_URL", "memory://")
        .env("DISTLOCK_TEST_PASSED_ON", "yes");
    let out = finish(cmd, PROMPT).await;
    out.expect_code(0);
    assert!(!out.stdout.contains("DISTLOCK_URL="), "{out:#?}");
    assert!(
        out.stdout.contains("DISTLOCK_TEST_PASSED_ON=yes"),
        "{out:#?}"
    );
}

/// A pipe on distlock's stdin is the command's stdin.
#[tokio::test]
async fn a_piped_stdin_reaches_the_command() {
    use tokio::io::AsyncWriteExt;
    let mut cmd = distlock(run_args(&[], "cat"));
    cmd.stdin(std::process::Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"from the pipe\n").await.unwrap();
    drop(stdin);
    let out = collect(child, started, PROMPT).await;
    out.expect_code(0);
    assert_eq!(out.stdout, "from the pipe\n");
}

/// A terminal on distlock's stdin is not given to the command (in its own process group
/// a read from it would stop the command for good, SIGTTIN, lock held): it reads
/// /dev/null and ends. `script` gives distlock a terminal.
#[tokio::test]
async fn a_terminal_stdin_is_not_given_to_the_command() {
    let line = format!(
        "{} run job --url memory:// -- sh -c 'cat; echo cat-ended'; true",
        env!("CARGO_BIN_EXE_distlock")
    );
    let mut cmd = tokio::process::Command::new("script");
    cmd.args(["-qec", &line, "/dev/null"])
        .env_remove("DISTLOCK_URL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let started = Instant::now();
    let child = cmd
        .spawn()
        .expect("script (util-linux) gives distlock a terminal");
    let out = collect(child, started, PROMPT).await;
    assert!(out.stdout.contains("cat-ended"), "{out:#?}");
}

/// SIGKILL to distlock kills the command too (its parent-death signal): it must not run on
/// unprotected once the lock expires.
#[tokio::test]
async fn a_killed_distlock_takes_its_command_with_it() {
    let sleeper = common::Sleeper::start("memory://", "job", &[]).await;
    let pid = sleeper.pid;
    common::kill(sleeper.child.id().unwrap(), libc::SIGKILL);
    let out = sleeper.finish().await;
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{out:#?}");
    assert_gone(pid, Duration::from_secs(5)).await;
}

/// Without a URL, `distlock run` takes a file lock in `$XDG_RUNTIME_DIR/distlock`, says so,
/// and excludes another `distlock` process (which exits 75 with `--no-wait`, as `flock -n`
/// does); a holder killed with SIGKILL frees it at once, and the next fence is greater.
#[tokio::test]
async fn the_default_file_lock_excludes_between_processes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pid-fence");
    let script = format!(
        "echo \"$$ $DISTLOCK_FENCE\" > {}; exec sleep 60",
        file.display()
    );
    let mut holder = distlock(["run", "default-shared", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let text = read_when_written(&file, PROMPT).await;
    let (_, fence) = text.trim().split_once(' ').expect("pid and fence");
    let fence: u64 = fence.parse().unwrap();

    let refused = finish(
        distlock(["run", "default-shared", "--no-wait", "--", "true"]),
        PROMPT,
    )
    .await;
    let lock_dir = common::runtime_dir().join("distlock");
    refused
        .expect_code(75)
        .expect_stderr("a file lock in file://")
        .expect_stderr(&lock_dir.display().to_string())
        .expect_stderr("excludes the processes of this host only");
    // Another key is free meanwhile.
    finish(
        distlock(["run", "default-other", "--no-wait", "--", "true"]),
        PROMPT,
    )
    .await
    .expect_code(0);

    let distlock_pid = holder.id().expect("running");
    common::kill(distlock_pid, libc::SIGKILL);
    holder.wait().await.unwrap();
    let next = finish(
        distlock([
            "run",
            "default-shared",
            "--no-wait",
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_FENCE",
        ]),
        PROMPT,
    )
    .await;
    next.expect_code(0);
    let after: u64 = next.stdout.trim().parse().unwrap();
    assert!(after > fence, "fence {after} after {fence}");
}

/// `distlock run --help` names the default file lock.
#[tokio::test]
async fn the_help_names_the_default_file_lock() {
    let out = finish(distlock(["run", "--help"]), PROMPT).await;
    out.expect_code(0);
    assert!(
        out.stdout
            .contains("Without --url or DISTLOCK_URL the lock is a file lock (flock)"),
        "{}",
        out.stdout
    );
}

/// A scheduled run needs fire-time claims, which a file lock cannot keep: on the default
/// it is refused with the reason (exit 69), never run on this host alone.
#[tokio::test]
async fn a_scheduled_run_on_the_default_file_lock_is_refused() {
    let out = finish(
        distlock(["run", "sched", "--schedule", "*/5 * * * * *", "--", "true"]),
        PROMPT,
    )
    .await;
    out.expect_code(69)
        .expect_stderr("the file backend cannot keep fire-time claims");
}
