//! Run records

use super::*;

/// Run records live beside the lock prefix (`<prefix minus its last character>.runs/`,
/// the job in hex), one key per record named by its slot, a marker per success, and one
/// key each for the last success, the last failure and the control; lowering the retention
/// trims the excess of each class at the next append (records and markers); a foreign
/// value under a record, last-record or control key is `Error::Backend`, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_records_keep_to_their_own_keys_and_refuse_foreign_values() {
    use distlock::records::{JobControl, Retention, RunOutcome, RunRecords};
    use etcd_client::GetOptions;

    let server = EtcdServer::start().await;
    let b = backend(&[server.endpoint()], "prefix=rec/").await;
    let records: &dyn RunRecords = b.run_records().expect("etcd keeps run records");
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let keys = |mut client: etcd_client::Client, from: &'static str| async move {
        let all = client
            .get(from, Some(GetOptions::new().with_prefix().with_keys_only()))
            .await
            .unwrap();
        let mut keys: Vec<String> = all
            .kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap().to_owned())
            .collect();
        keys.sort();
        keys
    };

    let job = "a/b";
    for n in 0..150 {
        let outcome = if n == 1 || n == 2 {
            RunOutcome::Ok
        } else {
            RunOutcome::Failed
        };
        records
            .append(&common::run_record(job, n, outcome), Retention::each(150))
            .await
            .unwrap();
    }
    let control = JobControl::new("op@host", std::time::UNIX_EPOCH).paused(true);
    records.set_control(job, &control).await.unwrap();
    let all = keys(client.clone(), "").await;
    assert_eq!(
        all.len(),
        150 + 2 + 3,
        "150 records, 2 success markers, the last success and failure, the control"
    );
    let slot = |n: u64| format!("{}:{n}", (1_800_000_000 + n) * 1000);
    for key in [
        "rec.runs/612f62/ok".to_owned(),
        "rec.runs/612f62/failed".to_owned(),
        "rec.runs/612f62/control".to_owned(),
        format!("rec.runs/612f62/r/{}", slot(0)),
        format!("rec.runs/612f62/s/{}", slot(1)),
        format!("rec.runs/612f62/s/{}", slot(2)),
    ] {
        assert!(all.contains(&key), "{key} in {all:?}");
    }
    assert!(
        all.iter().all(|k| k.starts_with("rec.runs/612f62/")),
        "{all:?}"
    );
    assert!(
        keys(client.clone(), "rec/").await.is_empty(),
        "nothing under the lock prefix"
    );

    // Lowering the retention trims the excess of each class (more than one trim batch of
    // failures; the older success and its marker) at the next append.
    records
        .append(
            &common::run_record(job, 150, RunOutcome::Failed),
            Retention::new(1, 2),
        )
        .await
        .unwrap();
    assert_eq!(keys(client.clone(), "rec.runs/612f62/r/").await.len(), 3);
    assert_eq!(
        keys(client.clone(), "rec.runs/612f62/s/").await,
        [format!("rec.runs/612f62/s/{}", slot(2))]
    );
    assert_eq!(
        records.recent(job, 10).await.unwrap(),
        [
            common::run_record(job, 150, RunOutcome::Failed),
            common::run_record(job, 149, RunOutcome::Failed),
            common::run_record(job, 2, RunOutcome::Ok),
        ]
    );
    assert_eq!(
        records.last_success(job).await.unwrap(),
        Some(common::run_record(job, 2, RunOutcome::Ok))
    );
    assert_eq!(
        records.last_failure(job).await.unwrap(),
        Some(common::run_record(job, 150, RunOutcome::Failed))
    );
    assert_eq!(records.control(job).await.unwrap(), Some(control));

    // A success replaced by another outcome loses its marker: it counts as the others do.
    records
        .append(
            &common::run_record(job, 2, RunOutcome::Missed),
            Retention::new(1, 3),
        )
        .await
        .unwrap();
    assert!(keys(client.clone(), "rec.runs/612f62/s/").await.is_empty());
    assert_eq!(
        records.recent(job, 10).await.unwrap(),
        [
            common::run_record(job, 150, RunOutcome::Failed),
            common::run_record(job, 149, RunOutcome::Failed),
            common::run_record(job, 2, RunOutcome::Missed),
        ],
        "replaced in its place"
    );

    // Foreign values ("x" is 78 in hex).
    client
        .put("rec.runs/78/r/zz", "not a record", None)
        .await
        .unwrap();
    client.put("rec.runs/78/ok", "{}", None).await.unwrap();
    client.put("rec.runs/78/failed", "[]", None).await.unwrap();
    client.put("rec.runs/78/control", "{}", None).await.unwrap();
    assert!(matches!(
        records.recent("x", 10).await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.last_success("x").await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.last_failure("x").await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.control("x").await,
        Err(Error::Backend { .. })
    ));
}

/// Fire-time claims from separate backends (each its own client): 50 fire times of one
/// job, each claimed by 4 backends at once (the job's key exists: the nested value
/// comparison decides), and each round the first claim of a new job by the same 4 (the
/// key is missing: the creation comparison decides): exactly one winner per fire time,
/// every refused contender is answered the winner's claim, and no answer has a clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_claims_race_across_backends_with_one_winner_each() {
    use distlock::claims::{from_fire_millis, ClaimAnswer};

    let server = EtcdServer::start().await;
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(Arc::new(
            backend(&[server.endpoint()], "prefix=race/").await,
        ));
    }
    let job = key("race");
    let race = |job: String, fire_ms: u64| {
        let claims = backends.iter().enumerate().map(|(i, b)| {
            let (b, job) = (b.clone(), job.clone());
            tokio::spawn(async move {
                b.fire_claims()
                    .unwrap()
                    .claim(&job, from_fire_millis(fire_ms), &format!("r{i}"))
                    .await
                    .unwrap()
            })
        });
        futures::future::join_all(claims)
    };
    let check = |what: &str, fire_ms: u64, answers: Vec<ClaimAnswer>| {
        let winners: Vec<_> = answers.iter().filter(|a| a.won).collect();
        assert_eq!(winners.len(), 1, "{what}: one winner: {answers:?}");
        let winner = &winners[0].claim;
        assert_eq!(winner.fire_time, from_fire_millis(fire_ms));
        assert!(
            answers
                .iter()
                .all(|a| &a.claim == winner && a.server_time.is_none()),
            "{what}: every answer carries the claim kept, and no clock: {answers:?}"
        );
        winner.replica.clone()
    };
    let unwrap = |v: Vec<Result<ClaimAnswer, tokio::task::JoinError>>| {
        v.into_iter().map(|a| a.unwrap()).collect::<Vec<_>>()
    };
    let mut last = String::new();
    for round in 0..50u64 {
        // Fire times across a power of ten, where a comparison of unpadded digits would err.
        let fire_ms = 9_999_999_999_975 + round;
        let fresh = format!("{job}/new-{round}");
        let (kept, first) = tokio::join!(race(job.clone(), fire_ms), race(fresh, fire_ms));
        last = check(&format!("round {round}"), fire_ms, unwrap(kept));
        check(&format!("new job {round}"), fire_ms, unwrap(first));
    }
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let kept = client
        .get(format!("race.claims/{job}"), None)
        .await
        .unwrap();
    let kv = &kept.kvs()[0];
    assert_eq!(
        kv.value_str().unwrap(),
        format!("{:020} {last}", 9_999_999_999_975u64 + 49)
    );
    assert_eq!(kv.lease(), 0, "a claim is on no lease");
    let locks = client
        .get("race/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(locks.count(), 0, "nothing under the lock prefix");
}

/// A value under a claim key that is not a claim (empty, not UTF-8, JSON, unpadded digits,
/// digits without a replica, a bare number sorting above every claim) is `Error::Backend`
/// for a claim and a read, and the claim leaves it as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_claims_refuse_foreign_values_and_leave_them_untouched() {
    use distlock::claims::from_fire_millis;

    let server = EtcdServer::start().await;
    let b = backend(&[server.endpoint()], "prefix=foreign/").await;
    let claims = b.fire_claims().expect("etcd keeps fire-time claims");
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let foreign: [&[u8]; 8] = [
        b"",
        b"\xff\xfe",
        b"{\"fire\":1}",
        b"not a claim",
        b"1800000000000 a",
        b"00000000000000000000",
        b"00000000000000000000 ",
        b"99999999999999999999",
    ];
    for (i, value) in foreign.iter().enumerate() {
        let job = format!("job-{i}");
        let key = format!("foreign.claims/{job}");
        client.put(key.as_str(), *value, None).await.unwrap();
        let revision = client.get(key.as_str(), None).await.unwrap().kvs()[0].mod_revision();
        assert!(
            matches!(claims.current(&job).await, Err(Error::Backend { .. })),
            "{value:?}"
        );
        let claimed = claims
            .claim(&job, from_fire_millis(1_800_000_000_000), "a")
            .await;
        assert!(
            matches!(claimed, Err(Error::Backend { .. })),
            "{value:?}: {claimed:?}"
        );
        let after = client.get(key.as_str(), None).await.unwrap();
        assert_eq!(after.kvs()[0].value(), *value, "left as it was");
        assert_eq!(after.kvs()[0].mod_revision(), revision, "not written");
    }
    // A claim beside them is made as usual.
    assert!(
        claims
            .claim("job", from_fire_millis(1_800_000_000_000), "a")
            .await
            .unwrap()
            .won
    );
}
