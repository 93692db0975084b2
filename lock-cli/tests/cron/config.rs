//! Schedule files and settings: refused before anything runs, or warned about.

use super::*;

/// Bad files: exit 64 with one line naming the job and the field, and nothing runs.
#[tokio::test]
async fn bad_files_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let good = format!(
        "[[job]]\nname = \"good\"\nschedule = \"* * * * * *\"\ncommand = [\"touch\", \"{}\"]\n",
        marker.display()
    );
    let cases: &[(&str, &str)] = &[
        (
            "[[job]]\nname = \"tz\"\nschedule = \"* * * * * *\"\ntime_zone = \"Mars/Olympus\"\ncommand = [\"true\"]\n",
            "job \"tz\", field `time_zone`",
        ),
        (
            "[[job]]\nname = \"sched\"\nschedule = \"61 * * * * *\"\ncommand = [\"true\"]\n",
            "job \"sched\", field `schedule`",
        ),
        (
            "[[job]]\nname = \"cmd\"\nschedule = \"* * * * * *\"\ncommand = \"true\"\n",
            "job \"cmd\", field `command`",
        ),
        (
            "[[job]]\nname = \"typo\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\ntimout = \"1s\"\n",
            "job \"typo\", field `timout`: unknown field",
        ),
        (
            "[[job]]\nname = \"dur\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\ntimeout = \"soon\"\n",
            "job \"dur\", field `timeout`",
        ),
        (
            "[[job]]\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n",
            "job #2, field `name`: missing",
        ),
        (
            "[[job]]\nname = \"late\"\nschedule = \"every 10s\"\nat_least = \"2s\"\nlateness = \"2s\"\ncommand = [\"true\"]\n",
            "job \"late\", field `lateness`: lateness 2s is not below at_least 2s",
        ),
        (
            "[[job]]\nname = \"long\"\nschedule = \"every 10s\"\nlateness = \"5s\"\ncommand = [\"true\"]\n",
            "job \"long\", field `lateness`: lateness 5s is not below at_least 5s (the default",
        ),
        (
            "[[job]]\nname = \"tiny\"\nschedule = \"every 10s\"\nlateness = \"5ms\"\ncommand = [\"true\"]\n",
            "job \"tiny\", field `lateness`: 5ms is shorter than a lock round trip",
        ),
        (
            "[[job]]\nname = \"sub\"\nschedule = \"every 500ms\"\ncommand = [\"true\"]\n",
            "job \"sub\", field `schedule`: `every 500ms` is shorter than one second",
        ),
        (
            "[[job]]\nname = \"months\"\nschedule = \"every 5M\"\ncommand = [\"true\"]\n",
            "job \"months\", field `schedule`: `every 5M` counts in months or years",
        ),
        (
            "[[job]]\nname = \"zoned\"\nschedule = \"every 1m\"\ntime_zone = \"Europe/Berlin\"\ncommand = [\"true\"]\n",
            "job \"zoned\", field `time_zone`: an `every` schedule does not depend on the time zone",
        ),
        ("time_zone = \"Nowhere/Land\"\n", "field `time_zone`"),
        ("[[job]\nname = \"x\"\n", "line 1"),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        // Top-level settings must come first; the good job goes after them.
        let text = if text.starts_with("[[job]]") {
            format!("{good}\n{text}")
        } else {
            format!("{text}\n{good}")
        };
        let file = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&file, &text).unwrap();
        let out = finish(
            distlock([
                "cron".as_ref(),
                file.as_os_str(),
                "--url".as_ref(),
                "memory://".as_ref(),
            ]),
            PROMPT,
        )
        .await;
        out.expect_code(64).expect_stderr(expected);
        assert_eq!(out.stderr.lines().count(), 1, "one line: {out:#?}\n{text}");
        assert!(
            out.stderr.contains(&file.display().to_string()),
            "names the file: {out:#?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!marker.exists(), "a job ran although the file was bad");
}

/// A grace longer than the TTL and a program not on PATH are warnings naming the file, the
/// job and the field: the file still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_above_the_ttl_and_a_missing_program_are_warnings() {
    let setup = Setup::new(
        r#"
grace = "5s"
[[job]]
name = "quick"
schedule = "every 10s"
ttl = "2s"
command = ["true"]
[[job]]
name = "absent"
schedule = "every 1h"
command = ["no-such-program-distlock-test"]
"#,
    );
    let mut replica = setup.replica("memory://", "only", &[]);
    let deadline = Instant::now() + PROMPT;
    while !replica.stderr().contains("cron: 2 job(s)") {
        assert!(
            Instant::now() < deadline,
            "did not start: {}",
            replica.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    replica.terminate(Duration::from_secs(30)).await;
    let stderr = replica.stderr();
    let file = setup.file.display().to_string();
    for needle in [
        format!("warning: {file}: job \"quick\", field `grace`: the grace 5s"),
        "longer than the lock's TTL 2s".to_owned(),
        format!("warning: {file}: job \"absent\", field `command`: `no-such-program-distlock-test` is not found on PATH"),
    ] {
        assert!(stderr.contains(&needle), "{needle:?} in {stderr}");
    }
}

/// Without --url or DISTLOCK_URL, `distlock cron` refuses to start (every replica would run
/// every job): exit 64, one line saying how to ask for one process explicitly.
#[tokio::test]
async fn no_url_is_refused_and_memory_must_be_asked_for() {
    let setup =
        Setup::new("[[job]]\nname = \"j\"\nschedule = \"every 1h\"\ncommand = [\"true\"]\n");
    let out = finish(distlock(["cron".as_ref(), setup.file.as_os_str()]), PROMPT).await;
    out.expect_code(64)
        .expect_stderr("every replica would run every job")
        .expect_stderr("--url memory://");
    assert_eq!(out.stderr.lines().count(), 1, "{out:#?}");
}

/// Redlock keeps no fire-time claims: the scheduler's refusal is one line, exit 69.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_is_refused_in_one_line() {
    let nodes = lock_testkit::RedisNodes::start(3).await;
    let hosts: Vec<String> = nodes.addrs().iter().map(|a| a.to_string()).collect();
    let url = format!("redlock://{}", hosts.join(","));
    let setup =
        Setup::new("[[job]]\nname = \"j\"\nschedule = \"every 1h\"\ncommand = [\"true\"]\n");
    let out = finish(
        distlock([
            "cron".as_ref(),
            setup.file.as_os_str(),
            "--url".as_ref(),
            url.as_ref(),
        ]),
        PROMPT,
    )
    .await;
    out.expect_code(69)
        .expect_stderr("the redlock backend cannot keep fire-time claims");
    assert_eq!(out.stderr.lines().count(), 1, "{out:#?}");
}
