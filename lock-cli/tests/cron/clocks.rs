//! Replicas with skewed clocks against the server's clock.

use super::*;

/// Three replicas on one Redis server, with clocks 0, 6 s behind and 5 s ahead of the
/// server's, one job every 3 s (the replica ahead by more than the period goes by the
/// server's clock, which its claims measure, so it never claims a fire time before the
/// earlier ones): each fire time runs exactly once, never before the fire time on the
/// server's (here the real) clock and within its lateness bound; the replicas that lost a
/// claim write no record of it, and each record carries its replica's clock offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_offsets_leave_each_fire_time_to_one_run_on_time() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start().await;
    let url = server.url();
    let setup = Setup::new(&format!(
        r#"
history = 1000
grace = "1s"
[[job]]
name = "tick"
schedule = "every 3s"
command = {}
"#,
        logged("true", 0)
    ));
    let mut replicas = [
        setup.replica(&url, "on-time", &["--clock-offset", "0s"]),
        setup.replica(&url, "behind", &["--clock-offset", "-6s"]),
        setup.replica(&url, "ahead", &["--clock-offset", "+5s"]),
    ];
    tokio::time::sleep(Duration::from_secs(26)).await;
    terminate_all(&mut replicas, Duration::from_secs(30)).await;
    let lines = setup.lines();
    let runs = runs(&lines).remove("tick").unwrap_or_default();
    let status = setup.status(&url).await;
    let stderr: Vec<String> = replicas.iter().map(Replica::stderr).collect();
    let context = format!("{runs:#?}\n{stderr:#?}\n{status:#}");
    let fires: Vec<i64> = runs.iter().map(|r| epoch_secs(&r.scheduled_at)).collect();
    let distinct: BTreeSet<i64> = fires.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        fires.len(),
        "a fire time ran twice: {context}"
    );
    let (first, last) = (*distinct.first().unwrap(), *distinct.last().unwrap());
    assert!(last - first >= 14, "too few runs: {context}");
    assert_eq!(
        distinct.len() as i64,
        (last - first) / 3 + 1,
        "a fire time did not run: {context}"
    );
    for run in &runs {
        let fire_ns = epoch_secs(&run.scheduled_at) as u128 * 1_000_000_000;
        // The claim's answer places the server's clock at the middle of a loopback round
        // trip: a few milliseconds of slack.
        assert!(
            run.start + 20_000_000 >= fire_ns,
            "a run started before its fire time: {run:?}\n{context}"
        );
        // The default lateness for 3 s is 750 ms; the command's start follows the grant.
        assert!(
            run.start < fire_ns + 4_000_000_000,
            "a run started late: {run:?}\n{context}"
        );
    }
    // One ok record per run, on its replica; a replica waiting for the server's clock to
    // reach a fire time it claimed when the shutdown came records it skipped-busy.
    let ok: BTreeSet<(String, String)> = records(&status, "tick")
        .into_iter()
        .filter(|(_, _, o)| o == "ok")
        .map(|(s, r, _)| (s, r))
        .collect();
    let ran: BTreeSet<(String, String)> = runs
        .iter()
        .map(|r| (r.scheduled_at.clone(), r.replica.clone()))
        .collect();
    assert_eq!(ok, ran, "{context}");
    // Each record says how far its replica's clock was from the server's.
    for r in job(&status, "tick")["fire_times"]
        .as_array()
        .expect("fire_times")
    {
        let expected = match r["replica"].as_str().unwrap() {
            "behind" => -6000,
            "ahead" => 5000,
            _ => 0,
        };
        let offset = r["clock_offset_ms"]
            .as_i64()
            .unwrap_or_else(|| panic!("a record without the offset: {r}\n{context}"));
        assert!(
            (offset - expected).abs() < 300,
            "offset {offset} ms of {r}: {context}"
        );
    }
}
