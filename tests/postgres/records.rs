//! Run records and fire-time claims.

use super::*;

/// Run records live in `<table>_runs`, made beside the lease table also when only it is
/// missing (an older deployment), and also for the longest table name; a foreign value in
/// it (a record, the last success or failure, the control) is `Error::Backend`, never a
/// panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_records_have_a_table_of_their_own_and_refuse_foreign_values() {
    use distlock::records::{Retention, RunOutcome, RunRecords};

    let server = PostgresServer::start().await;
    let raw = server.client().await;
    let url = postgres_url(server.addr(), "table=records");
    let first = backend(&url).await;
    assert_eq!(first.runs_table(), "\"public\".\"records_runs\"");
    drop(first);
    raw.batch_execute("DROP TABLE public.records_runs")
        .await
        .unwrap();
    let b = backend(&url).await;
    let records: &dyn RunRecords = b.run_records().expect("postgres keeps run records");
    for n in 0..4 {
        let outcome = if n == 0 {
            RunOutcome::Ok
        } else {
            RunOutcome::Failed
        };
        records
            .append(&common::run_record("job", n, outcome), Retention::each(2))
            .await
            .unwrap();
    }
    let rows: i64 = raw
        .query_one("SELECT count(*) FROM public.records_runs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        rows, 5,
        "the success, the two newest failures, the last success and the last failure"
    );
    let leases: i64 = raw
        .query_one("SELECT count(*) FROM public.records", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(leases, 0, "nothing in the lease table");

    // Foreign values.
    raw.execute(
        "INSERT INTO public.records_runs (job, id, record) VALUES ('\\x6f74686572', 0, 'x'), \
         ('\\x6f74686572', -1, '[]'), ('\\x6f74686572', -2, '{}'), \
         ('\\x6f74686572', 7, '{\"v\":1}')",
        &[],
    )
    .await
    .unwrap();
    assert!(matches!(
        records.recent("other", 10).await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.last_success("other").await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.last_failure("other").await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.control("other").await,
        Err(Error::Backend { .. })
    ));

    // The longest lease table name still has room for `_runs`.
    let long = "t".repeat(distlock::postgres::MAX_IDENTIFIER_LEN - "_fence".len());
    let b = backend(&postgres_url(server.addr(), &format!("table={long}"))).await;
    let records = b.run_records().unwrap();
    records
        .append(
            &common::run_record("job", 1, RunOutcome::Ok),
            Retention::each(5),
        )
        .await
        .unwrap();
    assert_eq!(
        records.last_success("job").await.unwrap(),
        Some(common::run_record("job", 1, RunOutcome::Ok))
    );
}

/// A run records' table made by a version before slots (no `slot`, `ok` or index; the
/// other tables there) is upgraded on connect: its rows read as before and count in their
/// class (read from their bytes) for the trim; new records upsert by slot beside them, and
/// the last success, last failure and control are kept apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_versions_run_records_table_is_upgraded_on_connect() {
    use distlock::records::{JobControl, Retention, RunOutcome};

    let server = PostgresServer::start().await;
    let raw = server.client().await;
    let url = postgres_url(server.addr(), "table=upgraded");
    drop(backend(&url).await);
    // The older version's table: only `(job, id, record)`, ids from the sequence.
    raw.batch_execute(
        "DROP TABLE public.upgraded_runs; \
         CREATE TABLE public.upgraded_runs (job bytea NOT NULL, id bigserial NOT NULL, \
         record bytea NOT NULL, PRIMARY KEY (job, id))",
    )
    .await
    .unwrap();
    let old = |n: u64, outcome| common::run_record("job", n, outcome);
    for (n, outcome) in [
        (0, RunOutcome::Ok),
        (1, RunOutcome::Failed),
        (2, RunOutcome::Ok),
        (3, RunOutcome::Failed),
    ] {
        raw.execute(
            "INSERT INTO public.upgraded_runs (job, record) VALUES ('job', $1)",
            &[&old(n, outcome).encode()],
        )
        .await
        .unwrap();
    }
    raw.execute(
        "INSERT INTO public.upgraded_runs (job, id, record) VALUES ('job', 0, $1)",
        &[&old(2, RunOutcome::Ok).encode()],
    )
    .await
    .unwrap();

    let b = backend(&url).await;
    let records = b.run_records().unwrap();
    let columns: i64 = raw
        .query_one(
            "SELECT count(*) FROM information_schema.columns \
             WHERE table_name = 'upgraded_runs' AND column_name IN ('slot', 'ok')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(columns, 2, "the columns are added");
    let index: bool = raw
        .query_one(
            "SELECT to_regclass('public.upgraded_slots') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(index, "the slot index is made");
    assert_eq!(
        records.recent("job", 10).await.unwrap(),
        [
            old(3, RunOutcome::Failed),
            old(2, RunOutcome::Ok),
            old(1, RunOutcome::Failed),
            old(0, RunOutcome::Ok)
        ],
        "the old rows read as before"
    );
    assert_eq!(
        records.last_success("job").await.unwrap(),
        Some(old(2, RunOutcome::Ok))
    );
    assert_eq!(records.last_failure("job").await.unwrap(), None);

    // A run under way, then its end (in its place); the old rows count in their class.
    let keep = Retention::new(2, 2);
    records
        .append(&old(4, RunOutcome::Running), keep)
        .await
        .unwrap();
    assert_eq!(
        records.recent("job", 10).await.unwrap(),
        [
            old(4, RunOutcome::Running),
            old(3, RunOutcome::Failed),
            old(2, RunOutcome::Ok),
            old(0, RunOutcome::Ok)
        ],
        "the oldest other (1) went; both old successes stay"
    );
    records.append(&old(4, RunOutcome::Ok), keep).await.unwrap();
    records
        .append(&old(5, RunOutcome::Missed), keep)
        .await
        .unwrap();
    assert_eq!(
        records.recent("job", 10).await.unwrap(),
        [
            old(5, RunOutcome::Missed),
            old(4, RunOutcome::Ok),
            old(3, RunOutcome::Failed),
            old(2, RunOutcome::Ok)
        ],
        "the end replaced the running record in its place; the oldest success (0) went"
    );
    assert_eq!(
        records.last_success("job").await.unwrap(),
        Some(old(4, RunOutcome::Ok))
    );
    let control = JobControl::new("op", std::time::UNIX_EPOCH).paused(true);
    records.set_control("job", &control).await.unwrap();
    records
        .append(&old(6, RunOutcome::TimedOut), keep)
        .await
        .unwrap();
    assert_eq!(records.control("job").await.unwrap(), Some(control));
    assert_eq!(
        records.last_failure("job").await.unwrap(),
        Some(old(6, RunOutcome::TimedOut))
    );
    let kept: i64 = raw
        .query_one("SELECT count(*) FROM public.upgraded_runs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        kept,
        4 + 3,
        "4 records, the last success and failure, the control"
    );
}

/// An append's trim deletes a record only as its snapshot saw it: a record replaced by
/// another session while the trim waits for it (a run's end, now a success, replacing its
/// running record, which was the oldest other) is left, not deleted for the class it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trim_leaves_a_record_replaced_after_its_snapshot() {
    use distlock::records::{Retention, RunOutcome};

    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=replaced&timeout=10s");
    let b = Arc::new(backend(&url).await);
    let records = b.run_records().unwrap();
    let keep = Retention::new(1, 1);
    let run = |n: u64, outcome| common::run_record("job", n, outcome);
    records
        .append(&run(1, RunOutcome::Running), keep)
        .await
        .unwrap();
    records.append(&run(2, RunOutcome::Ok), keep).await.unwrap();
    // Another session replaces the running record with its end, and holds the row.
    let raw = server.client().await;
    raw.batch_execute("BEGIN").await.unwrap();
    raw.execute(
        "UPDATE replaced_runs SET ok = true, record = $1 WHERE job = 'job' AND slot = $2",
        &[
            &run(1, RunOutcome::Ok).encode(),
            &run(1, RunOutcome::Ok).slot(),
        ],
    )
    .await
    .unwrap();
    let trim = {
        let b = b.clone();
        tokio::spawn(async move {
            b.run_records()
                .unwrap()
                .append(&run(3, RunOutcome::Missed), keep)
                .await
        })
    };
    let watch = server.client().await;
    let since = Instant::now();
    loop {
        let waiting: i64 = watch
            .query_one("SELECT count(*) FROM pg_locks WHERE NOT granted", &[])
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "the trim never waited"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    raw.batch_execute("COMMIT").await.unwrap();
    trim.await.unwrap().unwrap();
    assert_eq!(
        records.recent("job", 10).await.unwrap(),
        [
            run(3, RunOutcome::Missed),
            run(2, RunOutcome::Ok),
            run(1, RunOutcome::Ok)
        ],
        "the replaced record is left (one success too many until the next append)"
    );
    records
        .append(&run(4, RunOutcome::Missed), keep)
        .await
        .unwrap();
    assert_eq!(
        records.recent("job", 10).await.unwrap(),
        [run(4, RunOutcome::Missed), run(2, RunOutcome::Ok)],
        "the next append trims it"
    );
}

/// Fire-time claims from separate connections: 50 fire times of one job, each claimed by
/// 4 backends at once (the job's row updated under contention), and each round the first
/// claim of a new job by the same 4 (its row inserted under contention, where a refused
/// claim's kept row is out of its statement's snapshot): exactly one winner per fire time,
/// and every refused contender is answered the winner's claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_claims_race_across_connections_with_one_winner_each() {
    use distlock::claims::{from_fire_millis, ClaimAnswer};

    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=race");
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(Arc::new(backend(&url).await));
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
            answers.iter().all(|a| &a.claim == winner),
            "{what}: every answer carries the claim kept: {answers:?}"
        );
        winner.replica.clone()
    };
    let mut last = String::new();
    for round in 0..50u64 {
        let fire_ms = 1_800_000_000_000 + round * 60_000;
        let fresh = format!("{job}/new-{round}");
        let (kept, first) = tokio::join!(race(job.clone(), fire_ms), race(fresh, fire_ms));
        let unwrap = |v: Vec<Result<ClaimAnswer, tokio::task::JoinError>>| {
            v.into_iter().map(|a| a.unwrap()).collect::<Vec<_>>()
        };
        last = check(&format!("round {round}"), fire_ms, unwrap(kept));
        check(&format!("new job {round}"), fire_ms, unwrap(first));
    }
    let raw = server.client().await;
    let row = raw
        .query_one(
            "SELECT fire_ms, convert_from(replica, 'UTF8') FROM race_fires WHERE job = $1",
            &[&job.as_bytes()],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1_800_000_000_000 + 49 * 60_000);
    assert_eq!(
        row.get::<_, String>(1),
        last,
        "the last round's winner is kept"
    );
    let rows: i64 = raw
        .query_one("SELECT count(*) FROM race_fires", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 51, "one row per job");
}

/// A claim's times are the database's clock (read by another session before and after),
/// a refused claim keeps the claimed time of the one kept, job names with quotes, NUL or
/// SQL in them are stored byte for byte, the table is made beside the lease table (also
/// for the longest table name, and when only it is missing), and a foreign value in it is
/// `Error::Backend`, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_claims_answer_the_database_clock_and_keep_names_as_given() {
    use distlock::claims::from_fire_millis;
    use std::time::SystemTime;

    let server = PostgresServer::start().await;
    let raw = server.client().await;
    let url = postgres_url(server.addr(), "table=fires");
    let first = backend(&url).await;
    assert_eq!(first.fires_table(), "\"public\".\"fires_fires\"");
    drop(first);
    raw.batch_execute("DROP TABLE public.fires_fires")
        .await
        .unwrap();
    let b = backend(&url).await;
    let claims = b.fire_claims().expect("postgres keeps fire-time claims");
    let clock = || async {
        raw.query_one("SELECT clock_timestamp()", &[])
            .await
            .unwrap()
            .get::<_, SystemTime>(0)
    };
    let fire = from_fire_millis(1_800_000_000_000);
    let before = clock().await;
    let won = claims.claim("clock", fire, "a").await.unwrap();
    let after = clock().await;
    let (claimed, answered) = (won.claim.claimed_at.unwrap(), won.server_time.unwrap());
    assert!(won.won, "{won:?}");
    assert!(
        before <= claimed && claimed <= answered && answered <= after,
        "the database's clock: {before:?} <= {claimed:?} <= {answered:?} <= {after:?}"
    );
    let before = clock().await;
    let refused = claims.claim("clock", fire, "b").await.unwrap();
    let after = clock().await;
    assert!(!refused.won, "{refused:?}");
    assert_eq!(
        refused.claim, won.claim,
        "the claim kept, its time unchanged"
    );
    let answered = refused.server_time.unwrap();
    assert!(before <= answered && answered <= after, "{answered:?}");

    let jobs = [
        "'; DROP TABLE fires_fires; --",
        "\"quoted\" and 'single' \\ $1",
        "nul\0byte",
    ];
    for (i, job) in jobs.iter().enumerate() {
        let replica = format!("it's \"{i}\"");
        assert!(claims.claim(job, fire, &replica).await.unwrap().won);
        let row = raw
            .query_one(
                "SELECT replica, fire_ms FROM fires_fires WHERE job = $1",
                &[&job.as_bytes()],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, &[u8]>(0), replica.as_bytes());
        assert_eq!(row.get::<_, i64>(1), 1_800_000_000_000);
        assert_eq!(
            claims.current(job).await.unwrap().map(|c| c.replica),
            Some(replica)
        );
    }
    let leases: i64 = raw
        .query_one("SELECT count(*) FROM public.fires", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(leases, 0, "nothing in the lease table");

    // Foreign values: a negative fire time is refused by the table; a replica that is not
    // UTF-8 is an error, and the row is left as it was.
    assert!(raw
        .execute(
            "INSERT INTO fires_fires (job, fire_ms, replica, claimed_at) \
             VALUES ('\\x6e6567', -5, 'a', now())",
            &[],
        )
        .await
        .is_err());
    raw.execute(
        "INSERT INTO fires_fires (job, fire_ms, replica, claimed_at) \
         VALUES ('\\x62696e', 5, '\\xff', now())",
        &[],
    )
    .await
    .unwrap();
    assert!(matches!(
        claims.current("bin").await,
        Err(Error::Backend { .. })
    ));
    // Refused (the row's fire time is not older), answered from the foreign row.
    assert!(matches!(
        claims.claim("bin", from_fire_millis(5), "a").await,
        Err(Error::Backend { .. })
    ));
    let kept: (i64, Vec<u8>) = raw
        .query_one(
            "SELECT fire_ms, replica FROM fires_fires WHERE job = 'bin'",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!(kept, (5, vec![0xff]), "the foreign row is untouched");

    // The longest lease table name still has room for `_fires`.
    let long = "t".repeat(distlock::postgres::MAX_IDENTIFIER_LEN - "_fence".len());
    let b = backend(&postgres_url(server.addr(), &format!("table={long}"))).await;
    assert!(
        b.fire_claims()
            .unwrap()
            .claim("job", fire, "a")
            .await
            .unwrap()
            .won
    );
}

/// A refused claim is answered the claim kept as the row is, not as its statement's
/// snapshot saw it: a claim held up (by a test trigger waiting for an advisory lock) after
/// its snapshot was taken, while another connection claims the same fire time, is refused
/// with the other's claim, both when that claim created the job's row (invisible to the
/// held-up statement's snapshot: read again right after) and when it updated it (the
/// snapshot's version is an older claim: `FOR SHARE` reads the newest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_claim_answers_the_claim_committed_after_its_snapshot() {
    use distlock::claims::from_fire_millis;

    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=held&timeout=10s");
    let (slow, fast) = (Arc::new(backend(&url).await), backend(&url).await);
    let raw = server.client().await;
    raw.batch_execute(
        "CREATE FUNCTION hold_claim() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF NEW.replica = 'slow' THEN PERFORM pg_advisory_xact_lock(4242); END IF; \
           RETURN NEW; \
         END $$; \
         CREATE TRIGGER hold BEFORE INSERT ON held_fires \
         FOR EACH ROW EXECUTE FUNCTION hold_claim()",
    )
    .await
    .unwrap();
    let fire = from_fire_millis(1_800_000_000_000);
    let (new_job, old_job) = (key("created"), key("updated"));
    assert!(
        fast.fire_claims()
            .unwrap()
            .claim(&old_job, fire - Duration::from_secs(60), "earlier")
            .await
            .unwrap()
            .won
    );
    for job in [new_job, old_job] {
        raw.batch_execute("SELECT pg_advisory_lock(4242)")
            .await
            .unwrap();
        let held = {
            let (slow, job) = (slow.clone(), job.clone());
            tokio::spawn(async move { slow.fire_claims().unwrap().claim(&job, fire, "slow").await })
        };
        let since = Instant::now();
        loop {
            let waiting: i64 = raw
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "the trigger never ran"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let won = fast
            .fire_claims()
            .unwrap()
            .claim(&job, fire, "fast")
            .await
            .unwrap();
        assert!(won.won, "{job}: {won:?}");
        raw.batch_execute("SELECT pg_advisory_unlock(4242)")
            .await
            .unwrap();
        let refused = held.await.unwrap().unwrap();
        assert!(!refused.won, "{job}: {refused:?}");
        assert_eq!(refused.claim, won.claim, "{job}: the claim kept");
        assert!(refused.server_time.is_some());
    }
}
