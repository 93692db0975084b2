//! Schedule files read, and refused with the place of each problem.
use super::*;

fn place_of(text: &str) -> (Place, String) {
    let e = parse(text).expect_err("a bad file");
    (e.place, e.message)
}

fn job_field(job: &str, field: &str) -> Place {
    Place::Job {
        job: job.to_owned(),
        field: field.to_owned(),
    }
}

#[test]
fn defaults_at_the_top_apply_to_every_job_and_a_job_overrides_them() {
    let file = parse(
        r#"
time_zone = "Europe/Berlin"
timeout = "10m"
at_least = "5s"
grace = "3s"
history = 7

[[job]]
name = "a"
schedule = "0 30 2 * * *"
command = ["/bin/a", "--x"]

[[job]]
name = "b"
schedule = "0 */5 * * * *"
time_zone = "UTC"
timeout = "1m"
on_busy = "wait"
leave_children = true
command = ["b"]
"#,
    )
    .unwrap();
    assert_eq!(file.grace, Duration::from_secs(3));
    assert_eq!(file.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);
    assert_eq!(file.history, 7);
    let [a, b] = &file.jobs[..] else {
        panic!("two jobs")
    };
    assert!(!a.leave_children, "the group is stopped by default");
    assert!(b.leave_children);
    assert_eq!(a.job.name(), "a");
    assert_eq!(a.command, ["/bin/a", "--x"]);
    assert_eq!(a.time_zone.as_deref(), Some("Europe/Berlin"));
    assert_eq!(a.timeout, Some(Duration::from_secs(600)));
    assert_eq!(a.job.schedule().expression(), Some("0 30 2 * * *"));
    assert_eq!(b.time_zone.as_deref(), Some("UTC"));
    assert_eq!(b.timeout, Some(Duration::from_secs(60)));
    assert_eq!(b.job.schedule().expression(), Some("0 */5 * * * *"));
}

#[test]
fn catch_up_and_history_are_read_at_the_top_and_per_job() {
    let file = parse(
        r#"
history = 50
history_failed = 20
catch_up = "latest"

[[job]]
name = "a"
schedule = "0 30 2 * * *"
command = ["a"]

[[job]]
name = "b"
schedule = "0 30 2 * * *"
catch_up = "latest"
starting_deadline = "1h"
history_failed = 5
command = ["b"]

[[job]]
name = "c"
schedule = "0 30 2 * * *"
catch_up = "none"
command = ["c"]
"#,
    )
    .unwrap();
    assert_eq!((file.history, file.history_failed), (50, 20));
    let [a, b, c] = &file.jobs[..] else {
        panic!("three jobs")
    };
    let day = Duration::from_secs(24 * 3600);
    assert_eq!(
        a.job.catch_up_value(),
        CatchUp::Latest { deadline: day },
        "the top's, with the default deadline"
    );
    assert_eq!(a.job.history_value(), None, "the scheduler's (50, 20)");
    assert_eq!(
        b.job.catch_up_value(),
        CatchUp::Latest {
            deadline: Duration::from_secs(3600)
        }
    );
    assert_eq!(b.job.history_value(), Some(Retention::new(50, 5)));
    assert_eq!(c.job.catch_up_value(), CatchUp::None);
}

#[test]
fn each_problem_names_its_job_and_field() {
    let job = |extra: &str| {
        format!("[[job]]\nname = \"j\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n{extra}")
    };
    let cases = [
        (
            job("time_zone = \"Mars/Base\""),
            job_field("\"j\"", "time_zone"),
        ),
        (job("timeout = \"0s\""), job_field("\"j\"", "timeout")),
        (job("timeout = 5"), job_field("\"j\"", "timeout")),
        (job("at_least = \"soon\""), job_field("\"j\"", "at_least")),
        (job("on_busy = \"queue\""), job_field("\"j\"", "on_busy")),
        (job("catch_up = \"all\""), job_field("\"j\"", "catch_up")),
        (
            job("starting_deadline = \"1h\""),
            job_field("\"j\"", "starting_deadline"),
        ),
        (
            job("catch_up = \"none\"\nstarting_deadline = \"1h\""),
            job_field("\"j\"", "starting_deadline"),
        ),
        (
            job("catch_up = \"latest\"\nstarting_deadline = \"0s\""),
            job_field("\"j\"", "starting_deadline"),
        ),
        (
            job("history_failed = 0"),
            job_field("\"j\"", "history_failed"),
        ),
        (job("history = \"many\""), job_field("\"j\"", "history")),
        (
            job("leave_children = \"yes\""),
            job_field("\"j\"", "leave_children"),
        ),
        (
            format!("leave_children = true\n{}", job("")),
            Place::Top {
                field: "leave_children".into(),
            },
        ),
        (job("every = \"1s\""), job_field("\"j\"", "every")),
        (
            "[[job]]\nname = \"j\"\nschedule = \"* * * *\"\ncommand = [\"x\"]\n".into(),
            job_field("\"j\"", "schedule"),
        ),
        (
            "[[job]]\nname = \"j\"\nschedule = \"every soon\"\ncommand = [\"x\"]\n".into(),
            job_field("\"j\"", "schedule"),
        ),
        (
            "[[job]]\nname = \"j\"\nschedule = \"* * * * * *\"\ncommand = []\n".into(),
            job_field("\"j\"", "command"),
        ),
        (
            "[[job]]\nname = \"j\"\nschedule = \"* * * * * *\"\ncommand = [\"a\", 1]\n".into(),
            job_field("\"j\"", "command"),
        ),
        (
            "[[job]]\nname = \"j\"\nschedule = \"* * * * * *\"\n".into(),
            job_field("\"j\"", "command"),
        ),
        (
            "[[job]]\nschedule = \"* * * * * *\"\ncommand = [\"x\"]\n".into(),
            job_field("#1", "name"),
        ),
        (
            format!("{}{}", job(""), job("")),
            job_field("\"j\"", "name"),
        ),
        (
            format!("time_zone = \"Nowhere\"\n{}", job("")),
            Place::Top {
                field: "time_zone".into(),
            },
        ),
        (
            format!("history = 0\n{}", job("")),
            Place::Top {
                field: "history".into(),
            },
        ),
        ("history = 3\n".into(), Place::File),
    ];
    for (text, expected) in cases {
        let (place, message) = place_of(&text);
        assert_eq!(place, expected, "{text}\n{message}");
        assert!(!message.contains('\n'), "one line: {message}");
    }
}

#[test]
fn a_syntax_error_gives_its_line_and_column() {
    let (place, message) = place_of("history = 3\n\n[[job]\nname = 1\n");
    assert_eq!(place, Place::Syntax { line: 3, column: 7 }, "{message}");
    assert!(message.starts_with("not valid TOML"), "{message}");
}

#[test]
fn the_message_names_file_job_and_field_on_one_line() {
    let e = parse("[[job]]\nname = \"n\"\nschedule = \"61 * * * * *\"\ncommand = [\"x\"]\n")
        .unwrap_err()
        .into_cli(Path::new("jobs.toml"));
    assert_eq!(e.code, USAGE);
    assert!(
        e.message
            .starts_with("jobs.toml: job \"n\", field `schedule`: invalid cron expression"),
        "{}",
        e.message
    );
    assert!(e.message.contains("second field"), "{}", e.message);
}

#[test]
fn mode_leader_names_an_election_and_a_ttl() {
    let job = "[[job]]\nname = \"n\"\nschedule = \"every 10s\"\ncommand = [\"x\"]\n";
    let file = parse(job).unwrap();
    assert_eq!(file.leader, None, "every replica fires by default");
    let file = parse(&format!("mode = \"leader\"\n{job}")).unwrap();
    let mode = file.leader.expect("leader mode");
    assert_eq!(mode.election, DEFAULT_ELECTION);
    assert_eq!(mode.ttl, distlock::scheduler::DEFAULT_LEADER_TTL);
    let file = parse(&format!(
        "mode = \"leader\"\nelection = \"ops/cron\"\nleader_ttl = \"5s\"\n{job}"
    ))
    .unwrap();
    let mode = file.leader.expect("leader mode");
    assert_eq!(
        (mode.election.as_str(), mode.ttl),
        ("ops/cron", Duration::from_secs(5))
    );
    let top = |field: &str| Place::Top {
        field: field.to_owned(),
    };
    for (text, field) in [
        (format!("mode = \"single\"\n{job}"), "mode"),
        (format!("election = \"x\"\n{job}"), "election"),
        (
            format!("mode = \"each\"\nleader_ttl = \"5s\"\n{job}"),
            "leader_ttl",
        ),
        (
            format!("mode = \"leader\"\nelection = \"\"\n{job}"),
            "election",
        ),
        (
            format!("mode = \"leader\"\nleader_ttl = \"0s\"\n{job}"),
            "leader_ttl",
        ),
    ] {
        let (place, message) = place_of(&text);
        assert_eq!(place, top(field), "{text}\n{message}");
    }
}
