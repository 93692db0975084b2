//! `distlock status` on the in-process backend (a fresh process holds nothing).

mod common;

use common::{distlock, finish, PROMPT};

/// A key nobody holds is reported free, in text and in JSON, with exit 0.
#[tokio::test]
async fn free_key() {
    let out = finish(distlock(["status", "jobs/report"]), PROMPT).await;
    out.expect_code(0).expect_stderr("live inside one process");
    assert!(out.stdout.contains("state:      free"), "{out:#?}");

    let out = finish(distlock(["status", "jobs/report", "--json"]), PROMPT).await;
    out.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(v["key"], "jobs/report");
    assert_eq!(v["backend"], "memory");
    assert_eq!(v["held"], false);
    assert_eq!(v["fence"], serde_json::Value::Null);
    assert_eq!(v["cross_process"], false);
}
