//! `distlock` against a real `redis-server` (lock-testkit): exclusion between processes,
//! `--no-wait`, a lock taken away while the command runs, fencing tokens across runs,
//! `status`, and `bench` with its raw baseline.
#![cfg(feature = "redis")]

mod common;

use std::time::{Duration, Instant};

use common::{collect, distlock, finish, read_pid, run_args, Sleeper, PROMPT};
use lock_testkit::RedisServer;

/// lock-redis stores lock `name` at `distlock:{name}` (default prefix, hash tag).
fn redis_key(name: &str) -> String {
    format!("distlock:{{{name}}}")
}

/// Several `distlock run` processes on one key never run their commands at the same time:
/// each command appends its start and end (ns since the epoch) to one file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_on_one_key_never_overlap() {
    let server = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        "echo start $(date +%s%N) >> {log}; sleep 0.2; echo end $(date +%s%N) >> {log}",
        log = log.display()
    );
    let started = Instant::now();
    let children: Vec<_> = (0..4)
        .map(|_| {
            distlock(run_args(
                &server.url(),
                "overlap",
                &["--ttl", "2s"],
                &script,
            ))
            .spawn()
            .unwrap()
        })
        .collect();
    for child in children {
        collect(child, started, Duration::from_secs(60))
            .await
            .expect_code(0);
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let events: Vec<(&str, u128)> = text
        .lines()
        .map(|line| {
            let (what, at) = line.split_once(' ').expect("two fields");
            (what, at.parse().expect("a timestamp"))
        })
        .collect();
    assert_eq!(events.len(), 8, "{text}");
    let mut last_end = 0;
    for pair in events.chunks(2) {
        assert_eq!(pair[0].0, "start", "{text}");
        assert_eq!(pair[1].0, "end", "commands interleaved: {text}");
        assert!(
            pair[0].1 >= last_end,
            "a run started before the previous ended: {text}"
        );
        assert!(pair[1].1 >= pair[0].1, "{text}");
        last_end = pair[1].1;
    }
}

/// While one process holds the key, `--no-wait` exits 75 at once without running its
/// command, and `--wait` (or DISTLOCK_WAIT) gives up with 75 after its time; SIGTERM to the
/// holder releases the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_wait_exits_75_while_held() {
    let server = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let holder = Sleeper::start(&server.url(), "busy", &[]).await;

    let out = finish(
        distlock(run_args(
            &server.url(),
            "busy",
            &["--no-wait"],
            &format!("touch {}", ran.display()),
        )),
        PROMPT,
    )
    .await;
    out.expect_code(75)
        .expect_stderr("lock \"busy\" is held by another owner; not running the command");
    assert_eq!(out.stderr.lines().count(), 1, "{out:#?}");

    let out = finish(
        distlock(run_args(
            &server.url(),
            "busy",
            &["--wait", "300ms"],
            &format!("touch {}", ran.display()),
        )),
        PROMPT,
    )
    .await;
    out.expect_code(75).expect_stderr("gave up waiting");
    assert!(out.elapsed >= Duration::from_millis(300), "{out:#?}");
    assert!(!ran.exists(), "the command must not run without the lock");

    // The same from the environment, as a unit file sets it (DISTLOCK_WAIT is --wait, -w
    // its short flag); -n (--no-wait) wins over both, as flock's -n wins over its -w.
    let mut cmd = distlock(run_args(
        &server.url(),
        "busy",
        &[],
        &format!("touch {}", ran.display()),
    ));
    cmd.env("DISTLOCK_WAIT", "300ms");
    finish(cmd, PROMPT)
        .await
        .expect_code(75)
        .expect_stderr("gave up waiting for lock \"busy\" after");
    for extra in [&["-n"][..], &["-w", "1h", "-n"], &["-n", "--wait", "1h"]] {
        let mut cmd = distlock(run_args(&server.url(), "busy", extra, "true"));
        cmd.env("DISTLOCK_WAIT", "1h");
        finish(cmd, PROMPT)
            .await
            .expect_code(75)
            .expect_stderr("is held by another owner; not running the command");
    }
    // -q and -E 0: a conflict is a silent success.
    let quiet = finish(
        distlock(run_args(
            &server.url(),
            "busy",
            &["-n", "-q", "-E", "0"],
            "true",
        )),
        PROMPT,
    )
    .await;
    quiet.expect_code(0);
    assert_eq!(quiet.stderr, "", "{quiet:#?}");
    assert!(!ran.exists(), "the command must not run without the lock");

    // SIGTERM to the holder stops its command and releases the lock: free again.
    holder.terminate().await;
    finish(
        distlock(run_args(&server.url(), "busy", &["--no-wait"], "true")),
        PROMPT,
    )
    .await
    .expect_code(0);
}

/// A waiting `distlock run` does not start its command while the lock is held, and starts
/// it once the holder's run ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_runs_after_the_holder() {
    let server = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let go = dir.path().join("go");
    let ran = dir.path().join("ran");
    let started = Instant::now();
    let holder = distlock(run_args(
        &server.url(),
        "handoff",
        &[],
        &format!(
            "echo $$ > {}; while [ ! -e {} ]; do sleep 0.02; done",
            ready.display(),
            go.display()
        ),
    ))
    .spawn()
    .unwrap();
    read_pid(&ready, PROMPT).await;
    let waiter = distlock(run_args(
        &server.url(),
        "handoff",
        &["--wait", "20s"],
        &format!("touch {}; exit 7", ran.display()),
    ))
    .spawn()
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!ran.exists(), "the waiter ran while the lock was held");
    std::fs::write(&go, "").unwrap();
    collect(holder, started, PROMPT).await.expect_code(0);
    collect(waiter, started, PROMPT).await.expect_code(7);
    assert!(ran.exists());
}

/// When the lock is taken away behind distlock's back, the command is stopped and distlock
/// exits 76.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lock_stops_the_command() {
    let server = RedisServer::start().await;
    let sleeper = Sleeper::start(
        &server.url(),
        "lost",
        &["--ttl", "900ms", "--grace", "500ms"],
    )
    .await;
    let mut redis = server.client().await;
    let deleted: i64 = redis::cmd("DEL")
        .arg(redis_key("lost"))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        deleted,
        1,
        "the lock key {} should exist",
        redis_key("lost")
    );
    let deleted_at = Instant::now();

    let out = sleeper.expect_lost("lost").await;
    // Noticed at the next renewal (ttl/3) and stopped with SIGTERM.
    assert!(deleted_at.elapsed() < Duration::from_secs(5), "{out:#?}");
}

/// When the server stops answering, the lock's validity runs out while distlock cannot
/// renew it: the command is stopped and distlock exits 76.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_renewals_stop_the_command() {
    let server = RedisServer::start().await;
    let sleeper = Sleeper::start(
        &server.url(),
        "paused",
        &["--ttl", "900ms", "--grace", "300ms"],
    )
    .await;
    server.pause();
    sleeper.expect_lost("paused").await;
    server.resume();
}

/// Each run's DISTLOCK_FENCE is greater than the previous run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_increases_across_runs() {
    let server = RedisServer::start().await;
    let mut fences = Vec::new();
    for _ in 0..3 {
        let out = finish(
            distlock(run_args(
                &server.url(),
                "fenced",
                &[],
                "echo $DISTLOCK_FENCE",
            )),
            PROMPT,
        )
        .await;
        out.expect_code(0);
        assert!(
            !out.stderr.contains("note:"),
            "redis is cross-process: {out:#?}"
        );
        fences.push(out.stdout.trim().parse::<u64>().expect("a fence"));
    }
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
}

/// `status` reports a held key with its holder's fence and remaining time, and a free key
/// as free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_held_and_free() {
    let server = RedisServer::start().await;
    let url = server.url();
    let free = finish(distlock(["status", "inspected", "--url", &url]), PROMPT).await;
    free.expect_code(0);
    assert!(free.stdout.contains("state:      free"), "{free:#?}");

    let holder = Sleeper::start(&url, "inspected", &["--ttl", "20s"]).await;

    let held = finish(distlock(["status", "inspected", "--url", &url]), PROMPT).await;
    held.expect_code(0);
    assert!(held.stdout.contains("state:      held"), "{held:#?}");
    assert!(
        held.stdout
            .contains(&format!("fence:      {}", holder.fence)),
        "{held:#?}"
    );
    let json = finish(
        distlock(["status", "inspected", "--url", &url, "--json"]),
        PROMPT,
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["held"], true);
    assert_eq!(v["backend"], "redis");
    assert_eq!(v["cross_process"], true);
    assert_eq!(v["fence"].as_u64(), Some(holder.fence));
    let left = v["expires_in_ms"]
        .as_u64()
        .expect("redis tells the time left");
    assert!(left > 0 && left <= 20_000, "{v}");

    holder.terminate().await;
    let after = finish(distlock(["status", "inspected", "--url", &url]), PROMPT).await;
    assert!(after.stdout.contains("state:      free"), "{after:#?}");
}

/// `bench` against Redis and memory side by side: both measured, counts add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_redis_beside_memory() {
    let server = RedisServer::start().await;
    let url = server.url();
    let out = finish(
        distlock([
            "bench",
            "--url",
            "memory://",
            "--url",
            &url,
            "--tasks",
            "1,4",
            "--keys",
            "distinct,one",
            "--duration",
            "300ms",
            "--json",
        ]),
        Duration::from_secs(60),
    )
    .await;
    out.expect_code(0);
    let doc: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 8);
    for r in results {
        common::check_bench_counts(r);
        assert_eq!(r["errors"], 0, "{r}");
    }
    assert_eq!(
        results.iter().filter(|r| r["backend"] == "redis").count(),
        4
    );

    let text = finish(
        distlock([
            "bench",
            "--url",
            "memory://",
            "--url",
            &url,
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
    let header = text
        .stdout
        .lines()
        .find(|l| l.contains("memory://"))
        .expect("a header row");
    assert!(header.contains(&url), "side by side: {text:#?}");
}

/// `bench` shows Redis's raw baseline (SET NX PX + DEL) beside the lock cycle, in the
/// tables and in the JSON document, and leaves no raw key behind; `--no-baseline` skips it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_shows_the_raw_baseline() {
    let server = RedisServer::start().await;
    let url = server.url();
    common::bench_baseline_scenario(&url, "redis", "SET NX PX + DEL").await;
    let mut redis = server.client().await;
    let raw_keys: Vec<String> = redis::cmd("KEYS")
        .arg("*:baseline")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(raw_keys.is_empty(), "left behind: {raw_keys:?}");

    let out = finish(
        distlock([
            "bench",
            "--url",
            &url,
            "--tasks",
            "1",
            "--keys",
            "distinct",
            "--duration",
            "100ms",
            "--no-baseline",
            "--json",
        ]),
        Duration::from_secs(60),
    )
    .await;
    out.expect_code(0);
    let doc: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(doc["settings"]["baseline"], false, "{doc}");
    assert_eq!(
        doc["servers"][0]["baseline"],
        serde_json::Value::Null,
        "{doc}"
    );
    assert_eq!(doc["results"][0]["lock_over_raw"], serde_json::Value::Null);
}

/// Two hosts with the same crontab line, `distlock run --schedule 'every 2s'`, started
/// 300 ms apart just after a fire time: the first claims it and runs the command, the
/// second finds it claimed and, with `-E 0 -q`, exits 0 printing nothing (no cron mail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_run_runs_once_across_hosts() {
    let server = RedisServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        "echo \"$DISTLOCK_SCHEDULED_AT $DISTLOCK_FENCE\" >> {}",
        log.display()
    );
    let args = run_args(
        &url,
        "tick",
        &[
            "--schedule",
            "every 2s",
            "--lateness",
            "1500ms",
            "-E",
            "0",
            "-q",
        ],
        &script,
    );
    // Just after a fire time (whole even seconds of the Unix epoch).
    loop {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 2000;
        if (50..250).contains(&ms) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = distlock(&args).spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = distlock(&args).spawn().unwrap();
    let started = std::time::Instant::now();
    let a = collect(first, started, PROMPT).await;
    let b = collect(second, started, PROMPT).await;
    a.expect_code(0);
    b.expect_code(0);
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 1, "exactly one run: {lines:?}\n{a:#?}\n{b:#?}");
    let at = lines[0].split(' ').next().unwrap();
    let t: jiff::Timestamp = at.parse().expect("RFC 3339");
    assert!(at.ends_with('Z') && t.as_second() % 2 == 0, "{at}");
    let silent = [&a, &b]
        .into_iter()
        .filter(|o| o.stdout.is_empty() && o.stderr.is_empty())
        .count();
    assert_eq!(silent, 2, "neither prints anything: {a:#?}\n{b:#?}");
}

/// A lock held elsewhere: `-E N` chooses the exit status, `-q` silences the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_exit_code_and_quiet() {
    let server = RedisServer::start().await;
    let url = server.url();
    let holder = Sleeper::start(&url, "busy", &[]).await;
    let quiet = finish(
        distlock(run_args(
            &url,
            "busy",
            &["--no-wait", "-E", "0", "-q"],
            "echo ran",
        )),
        PROMPT,
    )
    .await;
    quiet.expect_code(0);
    assert_eq!(
        (quiet.stdout.as_str(), quiet.stderr.as_str()),
        ("", ""),
        "{quiet:#?}"
    );
    let loud = finish(
        distlock(run_args(
            &url,
            "busy",
            &["--no-wait", "--conflict-exit-code", "3"],
            "echo ran",
        )),
        PROMPT,
    )
    .await;
    loud.expect_code(3).expect_stderr("held by another owner");
    assert!(loud.stdout.is_empty(), "{loud:#?}");
    holder.terminate().await;
}

/// `run -p 2`: two commands on one key hold its two permits at once (each waits until the
/// other has started, so they can only finish together), and a third, with `-n`, is turned
/// away while they hold (exit 75); a plain lock on the key is another claim (exit 64).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_let_n_commands_run_at_once_and_no_more() {
    let server = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mark = |name: &str| dir.path().join(name).display().to_string();
    // Each writes its mark, waits (10 s at most) for the other's, then holds 5 s more.
    let both = |me: &str, other: &str| {
        format!(
            "touch {me}; i=0; while [ ! -e {other} ] && [ $i -lt 100 ]; do sleep 0.1; \
             i=$((i+1)); done; [ -e {other} ] && sleep 5",
            me = mark(me),
            other = mark(other)
        )
    };
    let started = Instant::now();
    let children: Vec<_> = [("a", "b"), ("b", "a")]
        .iter()
        .map(|(me, other)| {
            distlock(run_args(
                &server.url(),
                "permits",
                &["-p", "2", "--ttl", "10s"],
                &both(me, other),
            ))
            .spawn()
            .unwrap()
        })
        .collect();
    // Both hold now (each saw the other's mark before the second's sleep ends).
    let limit = Instant::now() + Duration::from_secs(20);
    while !(std::path::Path::new(&mark("a")).exists() && std::path::Path::new(&mark("b")).exists())
    {
        assert!(
            Instant::now() < limit,
            "the two permit holders never both started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let third = finish(
        distlock(run_args(
            &server.url(),
            "permits",
            &["-p", "2", "-n"],
            "true",
        )),
        Duration::from_secs(20),
    )
    .await;
    third.expect_code(75);
    let mismatched = finish(
        distlock(run_args(&server.url(), "permits", &["-n"], "true")),
        Duration::from_secs(20),
    )
    .await;
    mismatched.expect_code(64);
    let status = finish(
        distlock(["status", "permits", "--url", &server.url(), "--json"]),
        Duration::from_secs(20),
    )
    .await;
    status.expect_code(0);
    let doc: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    let holders = doc["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 2, "{doc}");
    assert!(
        holders.iter().all(|h| h["permits"] == "1 of 2 permits"),
        "{doc}"
    );
    for child in children {
        collect(child, started, Duration::from_secs(60))
            .await
            .expect_code(0);
    }
    let lock = finish(
        distlock(run_args(&server.url(), "permits", &["-n"], "true")),
        Duration::from_secs(20),
    )
    .await;
    // Both permits are released: the key is free, so a lock is granted.
    lock.expect_code(0);
}

/// `distlock elect` across processes: the first candidate leads and runs its command, a
/// second waits (its command does not run) while `distlock leader` shows the first's value
/// and term; when the leader's command ends, the standby leads at once (the resignation is
/// announced, no TTL wait) in a greater term; `distlock leader --watch` saw both leaders in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_runs_one_leader_and_hands_over_on_resign() {
    let server = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let go = dir.path().join("go");
    let ran = dir.path().join("ran");
    let elect = |value: &str, script: String| {
        let mut args: Vec<String> = [
            "elect",
            "cli-leader",
            "--url",
            &server.url(),
            "--ttl",
            "30s",
            "--value",
            value,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push("--".into());
        args.extend(common::sh(&script));
        distlock(args).spawn().unwrap()
    };
    let started = Instant::now();
    let watcher = distlock([
        "leader",
        "cli-leader",
        "--url",
        &server.url(),
        "--watch",
        "--json",
    ])
    .spawn()
    .unwrap();
    let first = elect(
        "first",
        format!(
            "echo $DISTLOCK_TERM > {}; while [ ! -e {} ]; do sleep 0.02; done",
            ready.display(),
            go.display()
        ),
    );
    let term1: u64 = common::read_when_written(&ready, PROMPT)
        .await
        .trim()
        .parse()
        .unwrap();
    let go2 = dir.path().join("go2");
    let second = elect(
        "second",
        format!(
            "echo $DISTLOCK_TERM > {}; while [ ! -e {} ]; do sleep 0.02; done",
            ran.display(),
            go2.display()
        ),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!ran.exists(), "the standby ran while the first led");
    let shown = finish(
        distlock(["leader", "cli-leader", "--url", &server.url(), "--json"]),
        PROMPT,
    )
    .await;
    shown.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(shown.stdout.trim()).unwrap();
    assert_eq!(v["value"], "first", "{}", shown.stdout);
    assert_eq!(v["term"], term1, "{}", shown.stdout);
    let resigned = Instant::now();
    std::fs::write(&go, "").unwrap();
    collect(first, started, PROMPT).await.expect_code(0);
    let term2: u64 = common::read_when_written(&ran, PROMPT)
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(
        resigned.elapsed() < Duration::from_secs(10),
        "the standby waited {:?}, not the 30 s TTL",
        resigned.elapsed()
    );
    // Long enough for the watcher to be told (a notice's delay, not a TTL's).
    tokio::time::sleep(Duration::from_secs(1)).await;
    std::fs::write(&go2, "").unwrap();
    collect(second, started, PROMPT).await.expect_code(0);
    assert!(term2 > term1, "terms increase: {term1} then {term2}");
    // The watcher printed the states in order: nobody, first, (nobody,) second, nobody.
    common::kill(watcher.id().unwrap(), libc::SIGTERM);
    let watched = collect(watcher, started, PROMPT).await;
    let leaders: Vec<String> = watched
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["leader"] == true)
        .map(|v| v["value"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(leaders, ["first", "second"], "{}", watched.stdout);
}
