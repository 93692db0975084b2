//! The run journal an operator reads with `distlock cron status`: a run shows as running
//! from its start and abandoned when its replica died; the output's tail kept; catch-up after downtime; an outage recorded as
//! `unavailable`; pause, resume and trigger acting on every replica through the server.

use super::*;

/// The `fire_times[]` of `name` in a status document.
fn lines<'a>(status: &'a Value, name: &str) -> &'a Vec<Value> {
    job(status, name)["fire_times"]
        .as_array()
        .expect("fire_times")
}

/// Polls `cron status` until `pred` holds of the job's lines, or panics after `limit`.
async fn status_until(
    setup: &Setup,
    url: &str,
    name: &str,
    limit: Duration,
    pred: impl Fn(&[Value]) -> bool,
) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let status = setup.status(url).await;
        if pred(lines(&status, name)) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "not within {limit:?}: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A long run shows as `running` (replica, pid, fence) in `cron status` from another
/// process while it runs; SIGKILL its replica and, once its lock expired, the line says
/// `abandoned`. A short job's output tail is in its ok record.
async fn running_then_abandoned(url: &str) {
    let _serial = SERIAL.lock().await;
    let setup = Setup::new(&format!(
        r#"
ttl = "2s"
[[job]]
name = "long"
schedule = "*/3 * * * * *"
command = {long}

[[job]]
name = "talk"
schedule = "*/2 * * * * *"
command = ["sh", "-c", "echo first line; echo tail-marker $DISTLOCK_SCHEDULED_AT"]
"#,
        long = logged("sleep 60", 0),
    ));
    let mut replica = setup.replica(url, "a", &[]);
    let started = wait_for_start(&setup, Duration::from_secs(20), |l| l.job == "long").await;
    let status = status_until(&setup, url, "long", PROMPT, |lines| {
        lines.iter().any(|l| l["state"] == "running")
    })
    .await;
    let running = lines(&status, "long")
        .iter()
        .find(|l| l["state"] == "running")
        .unwrap()
        .clone();
    assert_eq!(running["replica"], "a", "{running:#}");
    assert_eq!(running["scheduled_at"], started.scheduled_at.as_str());
    assert_eq!(running["pid"].as_u64(), Some(u64::from(replica.pid())));
    assert!(running["fence"].as_u64().is_some() && running["started_at"].is_string());
    assert_eq!(running["duration_ms"], Value::Null);

    let talk = status_until(&setup, url, "talk", PROMPT, |lines| {
        lines.iter().any(|l| l["outcome"] == "ok")
    })
    .await;
    let ok = lines(&talk, "talk")
        .iter()
        .find(|l| l["outcome"] == "ok")
        .unwrap();
    let output = ok["output"].as_str().unwrap_or_default();
    assert!(
        output.starts_with("first line\n")
            && output.ends_with(&format!(
                "tail-marker {}\n",
                ok["scheduled_at"].as_str().unwrap()
            )),
        "the output's tail is kept: {ok:#}"
    );

    let killed = replica.stop(libc::SIGKILL, PROMPT).await;
    assert_eq!(killed.code(), None);
    let fire = running["scheduled_at"].clone();
    status_until(&setup, url, "long", Duration::from_secs(15), |lines| {
        lines
            .iter()
            .any(|l| l["scheduled_at"] == fire && l["state"] == "abandoned")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_shows_running_then_abandoned_on_redis() {
    let server = RedisServer::start().await;
    running_then_abandoned(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_shows_running_then_abandoned_on_postgres() {
    let server = PostgresServer::start().await;
    running_then_abandoned(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_shows_running_then_abandoned_on_etcd() {
    let server = EtcdServer::start().await;
    running_then_abandoned(&format!("etcd://{}", server.addr())).await;
}

/// Waits until the wall clock is `offset` past a multiple of `period` seconds.
async fn align(period: u64, offset: Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = Duration::from_nanos((now.as_nanos() % u128::from(period * 1_000_000_000)) as u64);
    let wait = if into <= offset {
        offset - into
    } else {
        Duration::from_secs(period) - into + offset
    };
    tokio::time::sleep(wait).await;
}

/// Every replica down across fire times; at the restart (of two replicas) with
/// `catch_up = "latest"` the newest missed fire time runs once, flagged `catch-up`, and
/// the older one is one `missed` record.
async fn catch_up_after_downtime(url: &str) {
    let _serial = SERIAL.lock().await;
    let setup = Setup::new(&format!(
        r#"
lateness = "500ms"
at_least = "1s"
[[job]]
name = "daily"
schedule = "*/6 * * * * *"
catch_up = "latest"
starting_deadline = "1m"
command = {}
"#,
        logged("true", 0)
    ));
    let mut first = setup.replica(url, "a", &[]);
    let ran = wait_for_runs(&setup, "daily", 1, Duration::from_secs(20)).await;
    first.terminate(PROMPT).await;
    let last_ran = ran
        .iter()
        .map(|r| epoch_secs(&r.scheduled_at))
        .max()
        .unwrap();
    // Down across two fire times or more, then back 2 s after a fire time (outside its
    // lateness, 4 s before the next: room for a slow start).
    tokio::time::sleep(Duration::from_secs(8)).await;
    align(6, Duration::from_secs(2)).await;
    let mut replicas = vec![setup.replica(url, "b", &[]), setup.replica(url, "c", &[])];
    let back = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let newest_missed = back - back % 6;
    let caught = wait_for_start(&setup, Duration::from_secs(15), |l| {
        epoch_secs(&l.scheduled_at) == newest_missed
    })
    .await;
    // Past the next fire time, so any second run of the missed one would show.
    tokio::time::sleep(Duration::from_secs(3)).await;
    terminate_all(&mut replicas, Duration::from_secs(30)).await;
    let runs = runs(&setup.lines()).remove("daily").unwrap();
    assert_eq!(
        runs.iter()
            .filter(|r| epoch_secs(&r.scheduled_at) == newest_missed)
            .count(),
        1,
        "the newest missed fire time ran once: {runs:#?}"
    );
    assert!(["b", "c"].contains(&caught.replica.as_str()));
    let status = setup.status(url).await;
    let all = lines(&status, "daily");
    let line = |secs: i64| {
        all.iter()
            .find(|l| epoch_secs(l["scheduled_at"].as_str().unwrap()) == secs)
            .unwrap_or_else(|| panic!("no line for {secs}: {status:#}"))
    };
    let c = line(newest_missed);
    assert_eq!(c["cause"], "catch-up", "{c:#}");
    assert_eq!(c["outcome"], "ok", "{c:#}");
    assert_eq!(c["runs"], 1);
    // The fire times between the last run and the caught-up one: one summary record, at
    // the last of them.
    let missed: Vec<&Value> = all
        .iter()
        .filter(|l| {
            let s = epoch_secs(l["scheduled_at"].as_str().unwrap());
            s > last_ran && s < newest_missed
        })
        .collect();
    assert_eq!(missed.len(), 1, "one summary record: {status:#}");
    assert_eq!(missed[0]["outcome"], "missed");
    assert_eq!(
        epoch_secs(missed[0]["scheduled_at"].as_str().unwrap()),
        newest_missed - 6,
        "{status:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_runs_the_newest_missed_fire_time_once_on_redis() {
    let server = RedisServer::start().await;
    catch_up_after_downtime(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_runs_the_newest_missed_fire_time_once_on_postgres() {
    let server = PostgresServer::start().await;
    catch_up_after_downtime(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_runs_the_newest_missed_fire_time_once_on_etcd() {
    let server = EtcdServer::start().await;
    catch_up_after_downtime(&format!("etcd://{}", server.addr())).await;
}

/// The lock server paused across a fire time and past its latest start: that fire time is
/// recorded `unavailable` (once, for two replicas), not `failed`, and the record reaches
/// the server after the outage; a pause shorter than the lateness is retried and runs.
async fn an_outage_is_its_own_outcome(url: &str, pause: impl Fn(bool)) {
    let _serial = SERIAL.lock().await;
    let setup = Setup::new(&format!(
        r#"
lateness = "2s"
at_least = "2500ms"
ttl = "3s"
[[job]]
name = "sync"
schedule = "*/5 * * * * *"
command = {}
"#,
        logged("true", 0)
    ));
    let mut replicas = vec![setup.replica(url, "a", &[]), setup.replica(url, "b", &[])];
    wait_for_runs(&setup, "sync", 1, Duration::from_secs(20)).await;
    // A short outage: from 0.5 s before a fire time to 0.5 s after (within the lateness).
    align(5, Duration::from_millis(4500)).await;
    let short_fire = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 1) as i64
        / 5
        * 5;
    pause(true);
    tokio::time::sleep(Duration::from_secs(1)).await;
    pause(false);
    // A long one: from 0.5 s before the next fire time to 4 s after (past the lateness).
    align(5, Duration::from_millis(4500)).await;
    let long_fire = short_fire
        + 5 * ((std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
            + 1
            - short_fire)
            / 5);
    pause(true);
    tokio::time::sleep(Duration::from_millis(4500)).await;
    pause(false);
    let status = status_until(&setup, url, "sync", Duration::from_secs(20), |lines| {
        lines.iter().any(|l| {
            epoch_secs(l["scheduled_at"].as_str().unwrap()) == long_fire
                && l["outcome"] == "unavailable"
        })
    })
    .await;
    terminate_all(&mut replicas, Duration::from_secs(30)).await;
    let all = lines(&status, "sync");
    let of = |secs: i64| -> Vec<&Value> {
        all.iter()
            .filter(|l| epoch_secs(l["scheduled_at"].as_str().unwrap()) == secs)
            .collect()
    };
    assert_eq!(
        of(long_fire).len(),
        1,
        "one record for two replicas: {status:#}"
    );
    let short = of(short_fire);
    assert_eq!(short.len(), 1, "{status:#}");
    assert_eq!(
        short[0]["outcome"], "ok",
        "retried within its lateness: {status:#}"
    );
    assert!(
        all.iter().all(|l| l["outcome"] != "failed"),
        "an outage is no job failure: {status:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_recorded_unavailable_and_retried_on_redis() {
    let server = RedisServer::start().await;
    let url = server.url();
    an_outage_is_its_own_outcome(&url, |on| if on { server.pause() } else { server.resume() })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_recorded_unavailable_and_retried_on_postgres() {
    let server = PostgresServer::start().await;
    let url = server.url();
    an_outage_is_its_own_outcome(&url, |on| if on { server.pause() } else { server.resume() })
        .await;
}

/// `cron pause` stops the job on both replicas (status says paused), `cron trigger` runs
/// it once even so, `cron resume` starts it again. (The control is one value in the
/// server, kept by every backend as the conformance rule `run_records_replace_their_slot`
/// checks; Redis stands for them here.)
async fn pause_trigger_resume(url: &str) {
    let _serial = SERIAL.lock().await;
    let setup = Setup::new(&format!(
        r#"
[[job]]
name = "tick"
schedule = "*/2 * * * * *"
command = {}
"#,
        logged("true", 0)
    ));
    let control = |what: &str| {
        let what = what.to_owned();
        let url = url.to_owned();
        async move {
            let out = finish(
                distlock([
                    "cron",
                    what.as_str(),
                    "tick",
                    "--url",
                    url.as_str(),
                    "--by",
                    "ops",
                ]),
                PROMPT,
            )
            .await;
            out.expect_code(0);
            out.stdout
        }
    };
    let mut replicas = vec![setup.replica(url, "a", &[]), setup.replica(url, "b", &[])];
    wait_for_runs(&setup, "tick", 1, Duration::from_secs(20)).await;
    assert!(control("pause").await.contains("paused"));
    // A fire time already under way may still end (its command is `true`); then nothing
    // for two fire times.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before = setup.lines().len();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(setup.lines().len(), before, "paused: {:#?}", setup.lines());
    let status = setup.status(url).await;
    assert_eq!(job(&status, "tick")["paused"]["by"], "ops", "{status:#}");

    assert!(control("trigger").await.contains("triggered"));
    // Found within a poll (2 s); then time for a second run, which must not come.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !setup.lines()[before..].iter().any(|l| l.start) {
        assert!(Instant::now() < deadline, "the trigger did not run");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let triggered: Vec<Line> = setup.lines().split_off(before);
    assert_eq!(
        triggered.iter().filter(|l| l.start).count(),
        1,
        "one run for the trigger, on one replica: {triggered:#?}"
    );
    let status = setup.status(url).await;
    assert!(
        lines(&status, "tick")
            .iter()
            .any(|l| l["cause"] == "trigger" && l["outcome"] == "ok"),
        "{status:#}"
    );

    assert!(control("resume").await.contains("resumed"));
    let resumed = setup.lines().len();
    let deadline = Instant::now() + Duration::from_secs(10);
    while setup.lines().len() < resumed + 4 {
        assert!(
            Instant::now() < deadline,
            "not resumed: {:#?}",
            setup.lines()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = setup.status(url).await;
    assert_eq!(job(&status, "tick")["paused"], Value::Null);
    terminate_all(&mut replicas, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_trigger_resume_on_redis() {
    let server = RedisServer::start().await;
    pause_trigger_resume(&server.url()).await;
}
