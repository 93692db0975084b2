//! What reaches stderr: the libraries' warnings by default (a real one: a Redlock node down
//! at start, the etcd backend's warning about servers that free held locks early), `-q`
//! errors only, `-v` more, `RUST_LOG` its own filter.

mod common;

use common::{distlock, finish, Finished, PROMPT};

async fn distlock_with(args: &[&str]) -> Finished {
    finish(distlock(args), PROMPT).await
}

fn assert_lacks(out: &Finished, needle: &str) {
    assert!(
        !out.stderr.contains(needle),
        "stderr should not mention {needle:?}: {out:#?}"
    );
}

/// -vv shows the lock library's debug events (a grant), which the default hides; -q hides
/// distlock's own note about the default file lock, before or after the subcommand; -q and
/// -v together are refused.
#[tokio::test]
async fn verbose_and_quiet_move_the_filter() {
    let plain = distlock_with(&["run", "k", "--", "true"]).await;
    plain
        .expect_code(0)
        .expect_stderr("excludes the processes of this host only");
    assert_lacks(&plain, "lock granted");

    let debug = distlock_with(&["-vv", "run", "k", "--", "true"]).await;
    debug
        .expect_code(0)
        .expect_stderr("DEBUG")
        .expect_stderr("lock granted");

    for args in [
        &["-q", "run", "k", "--", "true"][..],
        &["run", "k", "--quiet", "--", "true"],
    ] {
        let quiet = distlock_with(args).await;
        quiet.expect_code(0);
        assert_eq!(quiet.stderr, "", "{quiet:#?}");
    }

    distlock_with(&["-q", "-v", "run", "k", "--", "true"])
        .await
        .expect_code(64)
        .expect_stderr("cannot be used with");
}

/// RUST_LOG replaces the filter: it can show the debug events without -v, or silence a
/// library; one that does not parse exits 64.
#[tokio::test]
async fn rust_log_sets_the_filter() {
    let mut cmd = distlock(["run", "k", "--", "true"]);
    cmd.env("RUST_LOG", "lock_core=debug");
    finish(cmd, PROMPT)
        .await
        .expect_code(0)
        .expect_stderr("lock granted");

    let mut cmd = distlock(["run", "k", "--", "true"]);
    cmd.env("RUST_LOG", "lock_core=[");
    finish(cmd, PROMPT)
        .await
        .expect_code(64)
        .expect_stderr("invalid RUST_LOG");
}

/// A Redlock node down at start is a library warning (the lock is still granted by the
/// majority): shown by default, hidden by -q and by a RUST_LOG that silences lock_redlock.
#[cfg(feature = "redlock")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_warning_reaches_stderr_unless_quiet() {
    use common::run_args;

    let nodes = lock_testkit::RedisNodes::start(2).await;
    let mut hosts: Vec<String> = nodes.addrs().iter().map(|a| a.to_string()).collect();
    // Nothing listens there: connection refused (nothing else is given it while `closed`
    // lives).
    let closed = lock_testkit::closed_port();
    hosts.push(format!("127.0.0.1:{}", closed.port()));
    let url = format!("redlock://{}", hosts.join(","));
    let warning = "redlock node down at start";

    let out = finish(distlock(run_args(&url, "k", &["-n"], "true")), PROMPT).await;
    out.expect_code(0)
        .expect_stderr("WARN")
        .expect_stderr("lock_redlock")
        .expect_stderr(warning);

    let quiet = finish(distlock(run_args(&url, "k", &["-n", "-q"], "true")), PROMPT).await;
    quiet.expect_code(0);
    assert_lacks(&quiet, warning);

    let mut cmd = distlock(run_args(&url, "k", &["-n"], "true"));
    cmd.env("RUST_LOG", "warn,lock_redlock=off");
    let filtered = finish(cmd, PROMPT).await;
    filtered.expect_code(0);
    assert_lacks(&filtered, warning);
}

/// The etcd server's version as its `/version` endpoint answers it.
#[cfg(feature = "etcd")]
async fn etcd_version(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let body = text.split_once("\r\n\r\n").expect("an HTTP answer").1;
    let v: serde_json::Value = serde_json::from_str(body.trim()).expect("JSON");
    v["etcdserver"].as_str().expect("etcdserver").to_owned()
}

/// The README's promise: on an etcd release with issue 15247 (before 3.4.30, 3.5.0 to
/// 3.5.11) distlock warns on stderr that the server may free a held lock early; on a fixed
/// release it does not; -q hides it.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_stale_leader_warning_reaches_stderr() {
    let server = lock_testkit::EtcdServer::start().await;
    let url = format!("etcd://{}", server.addr());
    let version = etcd_version(server.addr()).await;
    let numbers: Vec<u32> = version
        .split('.')
        .map(|n| n.parse().expect("a number"))
        .collect();
    let affected = match numbers[..] {
        [3, 4, patch, ..] => patch < 30,
        [3, 5, patch, ..] => patch < 12,
        [3, minor, ..] => minor < 4,
        _ => false,
    };
    let warning = "etcd issue 15247";
    let out = distlock_with(&["status", "k", "--url", &url]).await;
    out.expect_code(0);
    if affected {
        out.expect_stderr("WARN").expect_stderr(warning);
    } else {
        assert_lacks(&out, warning);
    }
    let quiet = distlock_with(&["status", "k", "--url", &url, "-q"]).await;
    quiet.expect_code(0);
    assert_lacks(&quiet, warning);
    assert_eq!(quiet.stderr, "", "{quiet:#?}");
}
