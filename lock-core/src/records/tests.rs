//! The records' encoding, slots, controls and retention.
use super::*;
use std::time::UNIX_EPOCH;

#[test]
fn a_record_reads_back_as_written() {
    let record = RunRecord {
        job: "jobs/nightly".into(),
        scheduled_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        replica: "host-a".into(),
        started_at: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_200)),
        ended_at: UNIX_EPOCH + Duration::from_millis(1_700_000_001_000),
        outcome: RunOutcome::Failed,
        fence: Some(42),
        detail: Some("exit status 3 \"quoted\" ünïcode".into()),
        clock_offset_ms: Some(-6042),
        pid: Some(4242),
        output: Some("line 1\nline 2 ünï\n".into()),
        cause: RunCause::CatchUp,
    };
    assert_eq!(RunRecord::decode("test", &record.encode()).unwrap(), record);
    let skipped = RunRecord {
        started_at: None,
        fence: None,
        detail: None,
        outcome: RunOutcome::SkippedBusy,
        ..record
    };
    assert_eq!(
        RunRecord::decode("test", &skipped.encode()).unwrap(),
        skipped
    );
}

#[test]
fn a_long_detail_is_cut_on_a_character_boundary() {
    let record = RunRecord {
        job: "j".into(),
        scheduled_at: UNIX_EPOCH,
        replica: "r".into(),
        started_at: None,
        ended_at: UNIX_EPOCH,
        outcome: RunOutcome::Failed,
        fence: None,
        detail: Some("é".repeat(MAX_DETAIL_LEN)),
        clock_offset_ms: None,
        pid: None,
        output: None,
        cause: RunCause::Schedule,
    };
    let back = RunRecord::decode("test", &record.encode()).unwrap();
    let detail = back.detail.unwrap();
    assert!(detail.len() <= MAX_DETAIL_LEN && detail.len() >= MAX_DETAIL_LEN - 1);
    assert!(detail.chars().all(|c| c == 'é'));
}

#[test]
fn a_long_output_keeps_its_newest_bytes() {
    let output = format!("{}{}", "a".repeat(MAX_OUTPUT_LEN), "é".repeat(10));
    let record =
        RunRecord::new("j", UNIX_EPOCH, "r", UNIX_EPOCH, RunOutcome::Ok).output(Some(output));
    let back = RunRecord::decode("test", &record.encode())
        .unwrap()
        .output
        .unwrap();
    assert!(back.len() <= MAX_OUTPUT_LEN && back.len() >= MAX_OUTPUT_LEN - 1);
    assert!(back.ends_with(&"é".repeat(10)), "the newest bytes stay");
}

#[test]
fn the_slot_is_the_fire_time_and_the_fence() {
    let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
    let record = RunRecord::new("j", at, "r", at, RunOutcome::Running);
    assert_eq!(record.slot(), "1700000000123:0");
    assert_eq!(record.fence(Some(7)).slot(), "1700000000123:7");
}

#[test]
fn a_control_reads_back_as_written() {
    let control = JobControl::new("op@host", UNIX_EPOCH + Duration::from_millis(5))
        .paused(true)
        .trigger(Some(UNIX_EPOCH + Duration::from_millis(9)));
    assert_eq!(JobControl::decode("t", &control.encode()).unwrap(), control);
    assert!(JobControl::decode("t", b"{}").is_err());
}

#[test]
fn retention_counts_at_least_one_of_each() {
    let keep = Retention::new(0, 3);
    assert_eq!(keep.of(RunOutcome::Ok), 1);
    assert_eq!(keep.of(RunOutcome::Failed), 3);
    assert_eq!(keep.of(RunOutcome::Running), 3);
}

#[test]
fn foreign_bytes_are_a_backend_error() {
    assert!(matches!(
        RunRecord::decode("test", b"not json"),
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        RunRecord::decode("test", br#"{"job":"j","outcome":"exploded"}"#),
        Err(Error::Backend { .. })
    ));
}

#[test]
fn every_outcome_has_a_name_that_reads_back() {
    for o in RunOutcome::ALL {
        assert_eq!(RunOutcome::from_name(o.as_str()), Some(o));
    }
}
