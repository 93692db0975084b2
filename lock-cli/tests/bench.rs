//! `distlock bench` on the in-process backend: the JSON document and its arithmetic, the
//! tables, and the exit status when operations fail.

mod common;

use common::{distlock, finish, Finished, PROMPT};
use serde_json::Value;

async fn bench_json(args: &[&str]) -> (Finished, Value) {
    let mut all = vec!["bench", "--json"];
    all.extend_from_slice(args);
    let out = finish(distlock(all), PROMPT).await;
    let doc = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("bench --json is not JSON ({e}): {out:#?}"));
    (out, doc)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Every workload is reported once, and its counts add up.
#[tokio::test]
async fn json_counts_add_up() {
    let (out, doc) = bench_json(&[
        "--tasks",
        "1,4",
        "--keys",
        "distinct,one",
        "--duration",
        "300ms",
    ])
    .await;
    out.expect_code(0);
    assert_eq!(doc["settings"]["duration_ms"], 300.0);
    assert_eq!(doc["settings"]["watchdog"], false);
    // No server, so no raw baseline.
    assert_eq!(doc["settings"]["baseline"], true);
    let servers = doc["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 1, "{doc}");
    assert_eq!(servers[0]["url"], "memory://");
    assert_eq!(servers[0]["backend"], "memory");
    assert_eq!(servers[0]["baseline"], Value::Null, "{doc}");
    assert_eq!(u(&doc["baseline_errors"]), 0);
    assert!(doc["measures"]["acquire"]
        .as_str()
        .unwrap()
        .contains("acquire"));
    let results = doc["results"].as_array().unwrap();
    let mut shapes: Vec<(u64, String)> = results
        .iter()
        .map(|r| (u(&r["tasks"]), r["keys"].as_str().unwrap().to_owned()))
        .collect();
    shapes.sort();
    assert_eq!(
        shapes,
        [
            (1, "distinct".to_owned()),
            (1, "one".to_owned()),
            (4, "distinct".to_owned()),
            (4, "one".to_owned())
        ]
    );
    for r in results {
        assert_eq!(r["url"], "memory://");
        assert_eq!(r["backend"], "memory");
        assert_eq!(r["lock_over_raw"], Value::Null, "{r}");
        common::check_bench_counts(r);
        assert_eq!(u(&r["errors"]), 0, "{r}");
        assert!(r["elapsed_s"].as_f64().unwrap() >= 0.3, "{r}");
    }
    assert_eq!(u(&doc["errors"]), 0);
}

/// Without --json: one table per workload with every row, and what is measured; no raw
/// rows without a server to measure.
#[tokio::test]
async fn tables() {
    let out = finish(
        distlock([
            "bench",
            "--tasks",
            "2",
            "--keys",
            "one",
            "--duration",
            "200ms",
        ]),
        PROMPT,
    )
    .await;
    out.expect_code(0);
    for needle in [
        "200ms per workload",
        "2 tasks, all on one key",
        "memory://",
        "cycles/s",
        "acquire p50",
        "acquire p90",
        "acquire p99",
        "acquire max",
        "worst wait",
        "fairness",
        "errors",
        "acquire: time from calling acquire",
    ] {
        assert!(
            out.stdout.contains(needle),
            "tables lack {needle:?}: {out:#?}"
        );
    }
    for absent in ["raw cycles/s", "lock cycle / raw", "raw server round trips"] {
        assert!(!out.stdout.contains(absent), "{absent:?}: {out:#?}");
    }
}

/// Failed operations (here: releases after the TTL ran out, watchdog off) are counted,
/// reported with their number, and make the exit status non-zero.
#[tokio::test]
async fn failures_are_counted_and_fail_the_run() {
    let (out, doc) = bench_json(&[
        "--tasks",
        "2",
        "--keys",
        "distinct",
        "--hold",
        "30ms",
        "--ttl",
        "5ms",
        "--duration",
        "300ms",
    ])
    .await;
    out.expect_code(1);
    let r = &doc["results"][0];
    let errors = u(&r["release_errors"]);
    assert!(errors > 0, "{r}");
    assert_eq!(u(&doc["errors"]), errors + u(&r["acquire_errors"]));
    out.expect_stderr(&format!("{} lock operation(s) failed", u(&doc["errors"])))
        .expect_stderr("not held");
    assert_eq!(
        u(&r["acquire"]["count"]),
        u(&r["cycles"]) + errors,
        "every grant was released once: {r}"
    );
}

/// With the watchdog on, a hold longer than the TTL is renewed and nothing fails.
#[tokio::test]
async fn watchdog_keeps_long_holds() {
    let (out, doc) = bench_json(&[
        "--tasks",
        "1",
        "--keys",
        "one",
        "--hold",
        "100ms",
        "--ttl",
        "60ms",
        "--duration",
        "300ms",
        "--watchdog",
    ])
    .await;
    out.expect_code(0);
    assert_eq!(doc["settings"]["watchdog"], true);
    assert!(u(&doc["results"][0]["cycles"]) >= 1);
}

/// `--permits N`: each cycle claims one of N permits of its key (a semaphore), said in the
/// settings; more tasks than permits on one key run without errors.
#[tokio::test]
async fn permits_are_a_claim_of_each_cycle() {
    let (out, doc) = bench_json(&[
        "--tasks",
        "8",
        "--keys",
        "one",
        "--permits",
        "3",
        "--duration",
        "300ms",
    ])
    .await;
    out.expect_code(0);
    assert_eq!(doc["settings"]["claim"], "1 of 3 permits", "{doc}");
    let result = &doc["results"][0];
    assert_eq!(u(&result["errors"]), 0, "{doc}");
    assert!(u(&result["cycles"]) > 0, "{doc}");
    let (out, doc) = bench_json(&["--tasks", "1", "--duration", "100ms"]).await;
    out.expect_code(0);
    assert_eq!(doc["settings"]["claim"], "lock", "{doc}");
}
