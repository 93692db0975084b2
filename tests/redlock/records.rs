//! Run records

use super::*;

/// Run records and job controls on a quorum: a foreign value on one node is outvoted (on
/// two of three it is that node's `Error::Backend`, never a panic); with one node of three
/// down, appends, control changes and reads go on with the majority; with two down they
/// fail with `QuorumNotReached`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_records_need_a_majority_and_outvote_a_foreign_value() {
    use distlock::records::{JobControl, Retention, RunOutcome, RunRecords};
    use RunOutcome::{Failed, Ok as Succeeded};

    let mut nodes = RedisNodes::start(3).await;
    let b = backend(&nodes.addrs(), "").await;
    let records: &dyn RunRecords = b.run_records().expect("redlock keeps run records");
    let run = |job: &str, n: u64, outcome| common::run_record(job, n, outcome);
    let keep = Retention::each(3);
    let control = |by: &str, secs| {
        JobControl::new(by, std::time::UNIX_EPOCH + Duration::from_secs(secs)).paused(true)
    };
    let set_raw = |i: usize, key: String| {
        let server = &nodes.nodes()[i];
        async move {
            let mut raw = server.client().await;
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg("not a record")
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    };

    // A foreign value on one node: outvoted. On two of three: the nodes' own error.
    let odd = "records/odd";
    set_raw(0, b.node(0).unwrap().runs_key(odd)).await;
    set_raw(0, b.node(0).unwrap().last_success_key(odd)).await;
    set_raw(0, b.node(0).unwrap().last_failure_key(odd)).await;
    set_raw(0, b.node(0).unwrap().control_key(odd)).await;
    records.append(&run(odd, 1, Succeeded), keep).await.unwrap();
    assert_eq!(
        records.recent(odd, 10).await.unwrap(),
        [run(odd, 1, Succeeded)]
    );
    assert_eq!(
        records.last_success(odd).await.unwrap(),
        Some(run(odd, 1, Succeeded))
    );
    assert_eq!(records.last_failure(odd).await.unwrap(), None);
    assert_eq!(records.control(odd).await.unwrap(), None);
    set_raw(1, b.node(1).unwrap().runs_key(odd)).await;
    set_raw(1, b.node(1).unwrap().last_success_key(odd)).await;
    set_raw(1, b.node(1).unwrap().last_failure_key(odd)).await;
    set_raw(1, b.node(1).unwrap().control_key(odd)).await;
    for result in [
        records.append(&run(odd, 2, Failed), keep).await.map(drop),
        records.recent(odd, 10).await.map(drop),
        records.last_success(odd).await.map(drop),
        records.last_failure(odd).await.map(drop),
        records.control(odd).await.map(drop),
    ] {
        assert!(matches!(result, Err(Error::Backend { .. })), "{result:?}");
    }

    // One node down: a majority is enough.
    let job = "records/majority";
    records.append(&run(job, 0, Succeeded), keep).await.unwrap();
    records.append(&run(job, 1, Failed), keep).await.unwrap();
    records.set_control(job, &control("a", 1)).await.unwrap();
    nodes.node_mut(2).kill();
    records.append(&run(job, 2, Failed), keep).await.unwrap();
    records.append(&run(job, 3, Failed), keep).await.unwrap();
    assert_eq!(
        records.recent(job, 10).await.unwrap(),
        [
            run(job, 3, Failed),
            run(job, 2, Failed),
            run(job, 1, Failed),
            run(job, 0, Succeeded)
        ],
        "3 of each class"
    );
    assert_eq!(
        records.last_success(job).await.unwrap(),
        Some(run(job, 0, Succeeded))
    );
    assert_eq!(
        records.last_failure(job).await.unwrap(),
        Some(run(job, 3, Failed))
    );
    records.append(&run(job, 4, Succeeded), keep).await.unwrap();
    assert_eq!(
        records.last_success(job).await.unwrap(),
        Some(run(job, 4, Succeeded))
    );
    assert_eq!(records.control(job).await.unwrap(), Some(control("a", 1)));
    records.set_control(job, &control("b", 2)).await.unwrap();
    assert_eq!(records.control(job).await.unwrap(), Some(control("b", 2)));

    // Two down: no majority.
    nodes.node_mut(1).kill();
    let started = Instant::now();
    for result in [
        records.append(&run(job, 5, Failed), keep).await.map(drop),
        records.recent(job, 10).await.map(drop),
        records.last_success(job).await.map(drop),
        records.last_failure(job).await.map(drop),
        records.set_control(job, &control("c", 3)).await.map(drop),
        records.control(job).await.map(drop),
    ] {
        match result {
            Err(Error::QuorumNotReached {
                granted, needed, ..
            }) => assert!(granted <= 1 && needed == 2, "{granted} of {needed}"),
            other => panic!("expected QuorumNotReached, got {other:?}"),
        }
    }
    assert!(
        started.elapsed() < b.timeout_for(None) * 6 + SLACK,
        "each call bounded by the per-node timeout"
    );
}
