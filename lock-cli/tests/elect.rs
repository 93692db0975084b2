//! `distlock elect` and `distlock leader` on the in-process backend: the command's
//! environment, exit statuses and bad input. Elections between processes need a lock
//! server: see redis.rs.

mod common;

use common::{distlock, finish, sh, PROMPT};

fn elect_args(extra: &[&str], script: &str) -> Vec<String> {
    let mut args: Vec<String> = vec!["elect".into(), "leaders/job".into()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--".into());
    args.extend(sh(script));
    args
}

/// The leader's command sees its name and its term (= its fence) and its exit code is
/// distlock's; memory:// says it decides nothing across processes.
#[tokio::test]
async fn the_leader_runs_the_command_with_its_term() {
    let out = finish(
        distlock(elect_args(
            &["--value", "me"],
            "echo \"$DISTLOCK_KEY|$DISTLOCK_TERM|$DISTLOCK_FENCE\"; exit 3",
        )),
        PROMPT,
    )
    .await;
    out.expect_code(3)
        .expect_stderr("decided inside this distlock process only");
    let fields: Vec<&str> = out.stdout.trim().split('|').collect();
    assert_eq!(fields.len(), 3, "{}", out.stdout);
    assert_eq!(fields[0], "leaders/job");
    assert_eq!(fields[1], fields[2], "the term is the fence");
    fields[1].parse::<u64>().expect("DISTLOCK_TERM is a number");
}

/// Bad input exits 64 with a message: an empty name, a value over 64 KiB, a zero TTL, no
/// command.
#[tokio::test]
async fn bad_input_exits_64() {
    let out = finish(distlock(["elect", "", "--", "true"]), PROMPT).await;
    out.expect_code(64).expect_stderr("empty");
    let long = "x".repeat(64 * 1024 + 1);
    let out = finish(distlock(elect_args(&["--value", &long], "true")), PROMPT).await;
    out.expect_code(64).expect_stderr("64 KiB");
    let out = finish(distlock(elect_args(&["--ttl", "0s"], "true")), PROMPT).await;
    out.expect_code(64);
    let out = finish(distlock(["elect", "n"]), PROMPT).await;
    out.expect_code(64);
}

/// `distlock leader` on a fresh memory:// says nobody leads, as text and as JSON.
#[tokio::test]
async fn leader_says_when_nobody_leads() {
    let out = finish(distlock(["leader", "leaders/none"]), PROMPT).await;
    out.expect_code(0);
    assert_eq!(out.stdout, "leaders/none: no leader\n");
    let out = finish(distlock(["leader", "leaders/none", "--json"]), PROMPT).await;
    out.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["leader"], false);
    assert_eq!(v["name"], "leaders/none");
}
