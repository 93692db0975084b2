//! Flags a crontab or a unit file sets through the environment (`DISTLOCK_*`, as `--help`
//! lists them), and the short flags. A flag on the command line wins over its variable.

mod common;

use common::{distlock, finish, read_when_written, run_args, PROMPT};

/// DISTLOCK_TTL is `--ttl`: a zero TTL from it is refused as `--ttl` would be, and
/// `--ttl`/`-t` on the command line wins over it.
#[tokio::test]
async fn ttl_from_the_environment() {
    let mut cmd = distlock(["run", "k", "--", "true"]);
    cmd.env("DISTLOCK_TTL", "0s");
    finish(cmd, PROMPT)
        .await
        .expect_code(64)
        .expect_stderr("invalid --ttl 0s");
    for flag in ["--ttl", "-t"] {
        let mut cmd = distlock(["run", "k", flag, "5s", "--", "true"]);
        cmd.env("DISTLOCK_TTL", "0s");
        finish(cmd, PROMPT).await.expect_code(0);
    }
}

/// DISTLOCK_TIMEOUT is `--timeout`: the command is stopped, exit 124.
#[tokio::test]
async fn timeout_from_the_environment() {
    let mut cmd = distlock(["run", "k", "--", "sleep", "30"]);
    cmd.env("DISTLOCK_TIMEOUT", "200ms")
        .env("DISTLOCK_GRACE", "5s");
    finish(cmd, PROMPT)
        .await
        .expect_code(124)
        .expect_stderr("--timeout 200ms")
        .expect_stderr("SIGKILL after 5s");
}

/// `-u` is `--url`; a URL from DISTLOCK_URL is named as such in errors, one from `-u` as
/// `--url`, which wins over the variable.
#[tokio::test]
async fn url_short_flag_and_origin() {
    for sub in [
        &["run", "k", "-u", "localhost:6379", "--", "true"][..],
        &["status", "k", "-u", "localhost:6379"],
        &["bench", "-u", "localhost:6379", "--duration", "100ms"],
    ] {
        let mut cmd = distlock(sub);
        cmd.env("DISTLOCK_URL", "nonsense");
        finish(cmd, PROMPT)
            .await
            .expect_code(64)
            .expect_stderr("invalid lock URL `localhost:6379` (from --url)");
    }
    for sub in [&["status", "k"][..], &["bench", "--duration", "100ms"]] {
        let mut cmd = distlock(sub);
        cmd.env("DISTLOCK_URL", "nonsense");
        finish(cmd, PROMPT)
            .await
            .expect_code(64)
            .expect_stderr("invalid lock URL `nonsense` (from DISTLOCK_URL)");
    }
}

/// DISTLOCK_METRICS_ADDR and DISTLOCK_METRICS_TEXTFILE are checked like their flags,
/// before the command runs.
#[tokio::test]
async fn metrics_flags_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let script = format!("touch {}", marker.display());
    let mut cmd = distlock(run_args("memory://", "k", &[], &script));
    cmd.env("DISTLOCK_METRICS_ADDR", "nonsense");
    finish(cmd, PROMPT)
        .await
        .expect_code(64)
        .expect_stderr("invalid --metrics-addr \"nonsense\"");
    let mut cmd = distlock(run_args("memory://", "k", &[], &script));
    cmd.env(
        "DISTLOCK_METRICS_TEXTFILE",
        dir.path().join("missing/job.prom"),
    );
    finish(cmd, PROMPT)
        .await
        .expect_code(64)
        .expect_stderr("its directory does not exist");
    assert!(!marker.exists(), "the command ran");
}

/// `distlock cron` takes its URL and its replica's name from DISTLOCK_URL and
/// DISTLOCK_REPLICA (the commands see that name); `cron status` its URL.
#[tokio::test]
async fn cron_url_and_replica_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("replica");
    let file = dir.path().join("jobs.toml");
    std::fs::write(
        &file,
        format!(
            "[[job]]\nname = \"j\"\nschedule = \"every 1s\"\ncommand = [\"sh\", \"-c\", \
             \"echo $DISTLOCK_REPLICA > {}\"]\n",
            seen.display()
        ),
    )
    .unwrap();
    let mut cmd = distlock([std::ffi::OsStr::new("cron"), file.as_os_str()]);
    cmd.env("DISTLOCK_URL", "memory://")
        .env("DISTLOCK_REPLICA", "web-3");
    let child = cmd.spawn().unwrap();
    let started = std::time::Instant::now();
    assert_eq!(read_when_written(&seen, PROMPT).await, "web-3\n");
    common::kill(child.id().unwrap(), libc::SIGTERM);
    let out = common::collect(child, started, PROMPT).await;
    out.expect_code(0)
        .expect_stderr("on memory:// as replica \"web-3\"");

    // `cron status` reads DISTLOCK_URL as well (memory:// keeps no records across
    // processes: it says so, and shows the job).
    let mut cmd = distlock([
        std::ffi::OsStr::new("cron"),
        "status".as_ref(),
        file.as_os_str(),
    ]);
    cmd.env("DISTLOCK_URL", "memory://");
    let status = finish(cmd, PROMPT).await;
    status
        .expect_code(0)
        .expect_stderr("keeps records inside one process");
    assert!(status.stdout.contains('j'), "{status:#?}");
}
