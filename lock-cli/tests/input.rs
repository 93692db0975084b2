//! Bad input gives one or two human lines on stderr and the documented exit status, for
//! every subcommand.

mod common;

use common::{distlock, finish, Finished, PROMPT};

async fn distlock_with(args: &[&str]) -> Finished {
    finish(distlock(args), PROMPT).await
}

/// Messages are short and never a Debug dump.
fn assert_human(out: &Finished) {
    let lines = out.stderr.lines().count();
    assert!((1..=2).contains(&lines), "one or two lines: {out:#?}");
    for marker in ["InvalidUrl {", "Error {", "Some(", "panicked"] {
        assert!(!out.stderr.contains(marker), "no debug output: {out:#?}");
    }
}

/// A URL without a scheme is refused with 64, naming the URL and the fix.
#[tokio::test]
async fn bad_url() {
    for sub in [
        &["run", "k", "--url", "localhost:6379", "--", "true"][..],
        &["status", "k", "--url", "localhost:6379"],
        &["bench", "--url", "localhost:6379", "--duration", "100ms"],
    ] {
        let out = distlock_with(sub).await;
        out.expect_code(64)
            .expect_stderr("invalid lock URL `localhost:6379` (from --url)")
            .expect_stderr("hint: use memory://");
        assert_human(&out);
    }
}

/// An unknown scheme is refused with 64 and the list of known ones.
#[tokio::test]
async fn unknown_scheme() {
    let out = distlock_with(&["run", "k", "--url", "consul://h:8500", "--", "true"]).await;
    out.expect_code(64)
        .expect_stderr("unknown scheme `consul`")
        .expect_stderr("memory, file, redis, rediss, redis+sentinel, redis+cluster, redlock, etcd");
    assert_human(&out);
}

/// DISTLOCK_URL is used when --url is absent, and named when it is wrong.
#[tokio::test]
async fn bad_url_from_the_environment() {
    let mut cmd = distlock(["run", "k", "--", "true"]);
    cmd.env("DISTLOCK_URL", "nonsense");
    let out = finish(cmd, PROMPT).await;
    out.expect_code(64)
        .expect_stderr("invalid lock URL `nonsense` (from DISTLOCK_URL)");
    assert_human(&out);
}

/// Unknown URL options are refused.
#[tokio::test]
async fn unknown_url_option() {
    let out = distlock_with(&["status", "k", "--url", "memory://?color=red"]).await;
    out.expect_code(64)
        .expect_stderr("unknown parameter `color`");
    assert_human(&out);
}

/// An empty key is refused with 64 before anything runs.
#[tokio::test]
async fn empty_key() {
    for sub in [&["run", "", "--", "true"][..], &["status", ""]] {
        let out = distlock_with(sub).await;
        out.expect_code(64)
            .expect_stderr("invalid key \"\": a lock key must not be empty");
        assert_human(&out);
    }
}

/// An oversized key is refused with 64, shown cut short.
#[tokio::test]
async fn oversized_key() {
    let key = "k".repeat(2000);
    let out = distlock_with(&["run", &key, "--", "true"]).await;
    out.expect_code(64).expect_stderr("at most 1024 bytes");
    assert!(out.stderr.len() < 300, "{out:#?}");
}

/// A zero TTL is refused with 64.
#[tokio::test]
async fn zero_ttl() {
    for sub in [
        &["run", "k", "--ttl", "0s", "--", "true"][..],
        &["bench", "--ttl", "0s", "--duration", "100ms"],
    ] {
        let out = distlock_with(sub).await;
        out.expect_code(64)
            .expect_stderr("invalid --ttl 0s")
            .expect_stderr("greater than zero");
        assert_human(&out);
    }
}

/// Durations without a unit or with junk are refused with 64, showing the expected form.
#[tokio::test]
async fn bad_durations() {
    for (flag, value) in [
        ("--ttl", "30"),
        ("--wait", "soon"),
        ("--timeout", "5 parsecs"),
        ("--grace", "ten seconds"),
    ] {
        let out = distlock_with(&["run", "k", flag, value, "--", "true"]).await;
        out.expect_code(64)
            .expect_stderr(&format!("invalid value '{value}' for '{flag} <DUR>'"))
            .expect_stderr("like 30s, 500ms");
    }
    let out = distlock_with(&["run", "k", "--timeout", "0s", "--", "true"]).await;
    out.expect_code(64)
        .expect_stderr("must be greater than zero");
}

/// --wait and --no-wait exclude each other; a missing command is a usage error.
#[tokio::test]
async fn usage_errors() {
    // (--wait and --no-wait: the last one wins, as in flock(1); see redis.rs.)
    let out = distlock_with(&["-q", "run", "k", "-v", "--", "true"]).await;
    out.expect_code(64).expect_stderr("cannot be used with");
    let out = distlock_with(&["run", "k"]).await;
    out.expect_code(64).expect_stderr("<CMD>");
    let out = distlock_with(&["run", "k", "true"]).await;
    out.expect_code(64);
    let out = distlock_with(&["bench", "--tasks", "0"]).await;
    out.expect_code(64);
    let out = distlock_with(&["bench", "--keys", "some"]).await;
    out.expect_code(64).expect_stderr("distinct");
}

/// --help documents every exit status and has examples.
#[tokio::test]
async fn help_documents_exit_statuses() {
    let out = distlock_with(&["run", "--help"]).await;
    out.expect_code(0);
    for needle in [
        "Examples:",
        " 64 ",
        " 69 ",
        " 70 ",
        " 75 ",
        " 76 ",
        " 124 ",
        " 126 ",
        " 127 ",
        "128+N",
        "DISTLOCK_FENCE",
    ] {
        assert!(out.stdout.contains(needle), "run --help lacks {needle:?}");
    }
    for sub in ["bench", "status"] {
        let out = distlock_with(&[sub, "--help"]).await;
        out.expect_code(0);
        assert!(out.stdout.contains("Examples:"), "{sub} --help");
    }
}

/// A backend that is not compiled in is 69, naming the feature to enable.
#[cfg(not(feature = "redis"))]
#[tokio::test]
async fn backend_not_compiled_in() {
    let out = distlock_with(&["run", "k", "--url", "redis://127.0.0.1:6379", "--", "true"]).await;
    out.expect_code(69)
        .expect_stderr("built without the redis:// backend")
        .expect_stderr("--features redis");
    assert_human(&out);
}

/// An unreachable server is 69 with the (redacted) URL and a hint, promptly.
#[cfg(feature = "redis")]
#[tokio::test]
async fn unreachable_server() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://:secret@127.0.0.1:{port}");
    for sub in [
        vec!["run", "k", "--no-wait", "--url", &url, "--", "true"],
        vec!["status", "k", "--url", &url],
        vec!["bench", "--url", &url, "--duration", "100ms"],
    ] {
        let out = distlock_with(&sub).await;
        out.expect_code(69)
            .expect_stderr("redis")
            .expect_stderr(&format!("127.0.0.1:{port}"))
            .expect_stderr("hint:");
        assert!(!out.stderr.contains("secret"), "password hidden: {out:#?}");
        assert_human(&out);
    }
}

/// `run --schedule` refuses what cannot work, in one line naming the flag, exit 64: a
/// period under a second, months, a zone on `every`, a lateness under 10 ms or not below
/// --at-least, a bad cron expression.
#[tokio::test]
async fn bad_schedules_for_run() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--schedule", "every 500ms"],
            "--schedule: `every 500ms` is shorter than one second",
        ),
        (
            &["--schedule", "every 5M"],
            "--schedule: `every 5M` counts in months or years",
        ),
        (
            &["--schedule", "every 5s", "--time-zone", "Europe/Berlin"],
            "--time-zone: an `every` schedule does not depend on the time zone",
        ),
        (
            &["--schedule", "every 5s", "--lateness", "5ms"],
            "--lateness: 5ms is shorter",
        ),
        (
            &[
                "--schedule",
                "every 10s",
                "--lateness",
                "2s",
                "--at-least",
                "1s",
            ],
            "--lateness: lateness 2s is not below at_least 1s",
        ),
        (
            &["--schedule", "61 * * * * *"],
            "--schedule: job \"k\": invalid cron expression",
        ),
        (
            &["--schedule", "* * * * * *", "--time-zone", "Mars/Base"],
            "--time-zone:",
        ),
    ];
    for (extra, expected) in cases {
        let mut args = vec!["run", "k", "--url", "memory://"];
        args.extend_from_slice(extra);
        args.extend(["--", "true"]);
        let out = distlock_with(&args).await;
        out.expect_code(64).expect_stderr(expected);
        assert_human(&out);
    }
}
