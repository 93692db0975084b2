//! Run records and fire-time claims.

use super::*;

/// Run records live at `<prefix>runs:{job}` (a list, trimmed by each append),
/// `<prefix>runs:{job}:ok` and `<prefix>runs:{job}:failed`, the job's control at
/// `<prefix>runs:{job}:control`, apart from the locks; a foreign value under any of these
/// keys is `Error::Backend` (never a panic, never a record), and an append over a value of
/// another type fails without touching it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_records_have_keys_of_their_own_and_refuse_foreign_values() {
    use distlock::records::{JobControl, Retention, RunOutcome, RunRecords};

    let server = RedisServer::start().await;
    let backend = backend(&format!("{}?prefix=rec%3A", server.url())).await;
    let node = backend.node().clone();
    let records: &dyn RunRecords = backend.run_records().expect("redis keeps run records");
    let job = "jobs/{nightly}";
    for n in 0..4 {
        let outcome = if n == 1 {
            RunOutcome::Ok
        } else {
            RunOutcome::Failed
        };
        records
            .append(&common::run_record(job, n, outcome), Retention::each(2))
            .await
            .unwrap();
    }
    assert_eq!(node.runs_key(job), "rec:runs:{jobs/{nightly}}");
    assert_eq!(node.last_success_key(job), "rec:runs:{jobs/{nightly}}:ok");
    assert_eq!(
        node.last_failure_key(job),
        "rec:runs:{jobs/{nightly}}:failed"
    );
    assert_eq!(node.control_key(job), "rec:runs:{jobs/{nightly}}:control");
    assert_eq!(raw_type(&server, &node.runs_key(job)).await, "list");
    for key in [node.last_success_key(job), node.last_failure_key(job)] {
        assert_eq!(raw_type(&server, &key).await, "string", "{key}");
    }
    let mut raw = server.client().await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    keys.sort();
    assert_eq!(
        keys,
        [
            node.runs_key(job),
            node.last_failure_key(job),
            node.last_success_key(job)
        ],
        "records write only their three keys, none a lock key would use"
    );
    let len: usize = redis::cmd("LLEN")
        .arg(node.runs_key(job))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        len, 3,
        "trimmed on every append to 2 of each class: 2 failures and the one success"
    );
    assert_eq!(
        records.last_success(job).await.unwrap(),
        Some(common::run_record(job, 1, RunOutcome::Ok))
    );
    assert_eq!(
        records.last_failure(job).await.unwrap(),
        Some(common::run_record(job, 3, RunOutcome::Failed))
    );
    let control = JobControl::new("op@host", std::time::UNIX_EPOCH).paused(true);
    records.set_control(job, &control).await.unwrap();
    assert_eq!(raw_type(&server, &node.control_key(job)).await, "string");
    assert_eq!(records.control(job).await.unwrap(), Some(control));

    // Foreign values.
    let foreign = "other";
    let _: () = redis::cmd("SET")
        .arg(node.last_success_key(foreign))
        .arg("not a record")
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(node.last_failure_key(foreign))
        .arg("not a record")
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(node.control_key(foreign))
        .arg("not a control")
        .query_async(&mut raw)
        .await
        .unwrap();
    raw_list(&server, &node.runs_key(foreign)).await;
    assert!(matches!(
        records.last_success(foreign).await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.last_failure(foreign).await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.control(foreign).await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.recent(foreign, 10).await,
        Err(Error::Backend { .. })
    ));
    let _: () = redis::cmd("SET")
        .arg(node.runs_key(foreign))
        .arg("a string, not a list")
        .query_async(&mut raw)
        .await
        .unwrap();
    let refused = records
        .append(
            &common::run_record(foreign, 9, RunOutcome::Ok),
            Retention::each(5),
        )
        .await;
    assert!(
        matches!(refused, Err(Error::Backend { .. })),
        "WRONGTYPE: {refused:?}"
    );
    assert!(matches!(
        records.recent(foreign, 10).await,
        Err(Error::Backend { .. })
    ));
    assert_eq!(
        raw_string(&server, &node.runs_key(foreign))
            .await
            .as_deref(),
        Some("a string, not a list"),
        "the foreign value is left as it was"
    );
    assert_eq!(
        raw_string(&server, &node.last_success_key(foreign))
            .await
            .as_deref(),
        Some("not a record"),
        "a refused append writes no last success either"
    );
    assert!(records.recent(job, 0).await.unwrap().is_empty());
}

/// Fire-time claims through two backends, each on its own connection, race: of 4
/// contenders for each of 50 fire times exactly one wins, and every answer names the
/// winner. The claim is one hash at `<prefix>claim:{job}` with a bounded expiry (at most
/// `CLAIM_RETENTION`, set again by each won claim), and nothing else is written; the
/// server time answered is the server's `TIME` (between two raw `TIME` calls around the
/// claim); fire times beyond 2^53 ms compare exactly; a foreign value at the claim key
/// (another type, a hash that is not a claim) is `Error::Backend` and left untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_time_claims_race_across_connections_and_refuse_foreign_values() {
    use distlock::redis::CLAIM_RETENTION;

    let server = RedisServer::start().await;
    let url = format!("{}?prefix=claims%3A", server.url());
    let (a, b) = (Arc::new(backend(&url).await), Arc::new(backend(&url).await));
    let node = a.node().clone();
    let job = "jobs/{nightly}";
    assert_eq!(node.claim_key(job), "claims:claim:{jobs/{nightly}}");
    let base = from_fire_millis(1_800_000_000_000);
    for n in 0..50u64 {
        let fire = base + Duration::from_secs(60 * n);
        let contenders = (0..4).map(|i| {
            let backend = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let claims = backend.fire_claims().expect("redis keeps claims");
                claims.claim(job, fire, &format!("r{i}")).await
            })
        });
        let answers: Vec<_> = futures::future::join_all(contenders)
            .await
            .into_iter()
            .map(|a| a.expect("the claim task").expect("the claim"))
            .collect();
        let winners: Vec<_> = answers.iter().filter(|a| a.won).collect();
        assert_eq!(winners.len(), 1, "fire time {n}: one winner: {answers:?}");
        let winner = &winners[0].claim;
        assert!(
            answers.iter().all(|a| &a.claim == winner),
            "fire time {n}: every answer names the winner: {answers:?}"
        );
        assert_eq!(winner.fire_time, fire);
        assert_eq!(
            b.fire_claims()
                .unwrap()
                .current(job)
                .await
                .unwrap()
                .as_ref(),
            Some(winner)
        );
    }

    // The key: one hash, with a bounded expiry; nothing else written.
    let key = node.claim_key(job);
    assert_eq!(raw_type(&server, &key).await, "hash");
    let mut raw = server.client().await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .unwrap();
    let bound = i64::try_from(CLAIM_RETENTION.as_millis()).unwrap();
    assert!(
        pttl > bound - 60_000 && pttl <= bound,
        "the claim's PTTL {pttl} ms is not within a minute below {CLAIM_RETENTION:?}"
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(keys, [key.as_str()], "claims write their key only");

    // The server's clock, not ours.
    let claims = a.fire_claims().unwrap();
    let before = raw_time(&server).await;
    let won = claims
        .claim(job, base + Duration::from_secs(3600 * 24), "clock")
        .await
        .unwrap();
    let after = raw_time(&server).await;
    let server_time = won.server_time.expect("redis has a clock");
    assert!(won.won, "{won:?}");
    assert!(
        before <= server_time && server_time <= after,
        "{before:?} <= {server_time:?} <= {after:?}: the server's TIME"
    );
    assert_eq!(won.claim.claimed_at, Some(server_time));
    let refused = claims.claim(job, base, "late").await.unwrap();
    assert!(!refused.won, "{refused:?}");
    assert_eq!(refused.claim, won.claim, "the kept claim, its server time");
    let answered = refused.server_time.unwrap();
    assert!(server_time <= answered && answered <= raw_time(&server).await);

    // Fire times past 2^53 ms (no Lua double holds them exactly) compare exactly.
    let far = from_fire_millis((1 << 60) + 1);
    assert!(claims.claim("far", far, "x").await.unwrap().won);
    let just_before = from_fire_millis(1 << 60);
    assert!(!claims.claim("far", just_before, "y").await.unwrap().won);
    let next = claims
        .claim("far", far + Duration::from_millis(1), "z")
        .await
        .unwrap();
    assert!(next.won, "{next:?}");
    assert_eq!(next.claim.fire_time, far + Duration::from_millis(1));

    // Foreign values: refused, never overwritten.
    let _: () = redis::cmd("SET")
        .arg(node.claim_key("string"))
        .arg("not a claim")
        .query_async(&mut raw)
        .await
        .unwrap();
    raw_list(&server, &node.claim_key("list")).await;
    let _: () = redis::cmd("HSET")
        .arg(node.claim_key("hash"))
        .arg("fire")
        .arg("soon")
        .query_async(&mut raw)
        .await
        .unwrap();
    for foreign in ["string", "list", "hash"] {
        let refused = claims.claim(foreign, base, "a").await;
        assert!(
            matches!(&refused, Err(Error::Backend { .. })),
            "{foreign}: {refused:?}"
        );
        let text = refused.unwrap_err().report().to_string();
        assert!(text.contains("not a fire-time claim"), "{text}");
        let read = claims.current(foreign).await;
        assert!(
            matches!(&read, Err(Error::Backend { .. })),
            "{foreign}: {read:?}"
        );
    }
    assert_eq!(
        raw_string(&server, &node.claim_key("string"))
            .await
            .as_deref(),
        Some("not a claim"),
        "the foreign string is left as it was"
    );
    assert_eq!(raw_type(&server, &node.claim_key("list")).await, "list");
    let fields: Vec<String> = redis::cmd("HGETALL")
        .arg(node.claim_key("hash"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        fields,
        ["fire", "soon"],
        "the foreign hash is left as it was"
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg(node.claim_key("hash"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(pttl, -1, "no expiry set on a foreign value");
}

/// A record is found by the exact text of its slot and classified by the exact text of
/// its outcome: a record whose detail holds another slot's text and `"outcome":"ok"`
/// (quotes escaped inside its JSON string) is neither replaced by that slot's record nor
/// counted as a success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_records_own_text_never_passes_for_a_slot_or_a_success() {
    use distlock::records::{Retention, RunOutcome, RunRecords};

    let server = RedisServer::start().await;
    let backend = backend(&server.url()).await;
    let records: &dyn RunRecords = backend.run_records().expect("redis keeps run records");
    let job = "jobs/text";
    let keep = Retention::new(1, 5);
    let success = |n| common::run_record(job, n, RunOutcome::Ok);
    let tricky = common::run_record(job, 1, RunOutcome::Failed).detail(Some(format!(
        "\"slot\":\"{}\",\"outcome\":\"ok\"",
        success(2).slot()
    )));
    records.append(&tricky, keep).await.unwrap();
    records.append(&success(2), keep).await.unwrap();
    assert_eq!(
        records.recent(job, 10).await.unwrap(),
        [success(2), tricky.clone()],
        "the success of slot 2 is a record of its own"
    );
    records.append(&success(3), keep).await.unwrap();
    assert_eq!(
        records.recent(job, 10).await.unwrap(),
        [success(3), tricky.clone()],
        "one success kept; the failure is no success, whatever its text"
    );
    // The end of slot 1 replaces it in place, and nothing else is left in the list.
    let ended = common::run_record(job, 1, RunOutcome::TimedOut);
    records.append(&ended, keep).await.unwrap();
    let mut raw = server.client().await;
    let items: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(backend.node().runs_key(job))
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(items, [success(3).encode(), ended.encode()]);
    assert_eq!(records.last_failure(job).await.unwrap(), Some(ended));
}
