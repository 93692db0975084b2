//! `RedlockBuilder`: the rules of `redlock://` URLs, the typed setters, and the round trip
//! between them.

use super::*;

fn from(url: &str) -> Result<RedlockBuilder> {
    RedlockBuilder::from_url(&LockUrl::parse(url)?)
}

#[test]
fn urls_give_the_configuration() {
    let b = from("redlock://h1,h2:7000,[::1]:7001").unwrap();
    assert_eq!(b.addrs(), ["h1:6379", "h2:7000", "[::1]:7001"]);
    assert_eq!(b.get_drift_factor(), DEFAULT_DRIFT_FACTOR);
    assert_eq!(b.get_node_timeout(), None);
    assert!(b.is_fencing());
    assert_eq!(b.get_prefix(), "distlock:");

    let b = from(
        "redlock://alice:p%40ss@h1:1,h2:2,h3:3/4?drift=0.05&prefix=app%3A&timeout=20ms&fencing=false",
    )
    .unwrap();
    assert_eq!(b.get_drift_factor(), 0.05);
    assert_eq!(b.get_node_timeout(), Some(Duration::from_millis(20)));
    assert!(!b.is_fencing());
    assert_eq!(b.get_prefix(), "app:");
    assert_eq!(b.db, 4);
    assert_eq!(b.username.as_deref(), Some("alice"));
    assert_eq!(b.password.as_deref(), Some("p@ss"));
    let nodes = b.node_builders();
    assert_eq!(nodes.len(), 3);
    assert!(nodes
        .iter()
        .all(|n| n.get_prefix() == "app:" && n.get_database() == 4));
}

#[test]
fn bad_urls_are_invalid_url_errors() {
    for (url, needle) in [
        ("redlock://h?foo=1", "unknown parameter `foo`"),
        ("redlock://h?drift=abc", "drift"),
        ("redlock://h?drift=1", "[0, 1)"),
        ("redlock://h?drift=-0.1", "[0, 1)"),
        ("redlock://h?timeout=5", "no unit"),
        ("redlock://h?timeout=0ms", "greater than zero"),
        ("redlock://h?fencing=yes", "`true` or `false`"),
        ("redlock://h1:1,h2:2,h1:1", "listed twice"),
        ("redlock://h1,h1:6379", "listed twice"),
        ("redis://h", "redlock://"),
        ("memory://", "redlock://"),
        ("redlock://:secret@h?bogus=1", "bogus"),
        ("redlock://:secret@h,h", "twice"),
    ] {
        match from(url) {
            Err(Error::InvalidUrl { url: shown, reason }) => {
                assert!(reason.contains(needle), "{url}: {reason}");
                assert!(!shown.contains("secret"), "{url}: password in {shown}");
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
}

#[test]
fn builder_checks_and_round_trips() {
    let b = RedlockBuilder::new(["10.0.0.1:7000", "10.0.0.2"])
        .username("bob")
        .password("hunter2")
        .database(3)
        .prefix("x:")
        .drift_factor(0.1)
        .node_timeout(Duration::from_micros(2500))
        .fencing(false);
    assert!(b.check("").is_ok());
    let url = b.url().unwrap();
    assert_eq!(
        url,
        "redlock://bob:hunter2@10.0.0.1:7000,10.0.0.2:6379/3?drift=0.1&prefix=x%3A&timeout=2.5ms&fencing=false"
    );
    let back = from(&url).unwrap();
    assert_eq!(back.url(), b.url());
    let plain = RedlockBuilder::new(["a"]);
    assert_eq!(plain.url().unwrap(), "redlock://a:6379");

    let refused = |b: RedlockBuilder| matches!(b.check(""), Err(Error::InvalidUrl { .. }));
    assert!(refused(RedlockBuilder::new(Vec::<String>::new())));
    assert!(refused(RedlockBuilder::new(["a b"])));
    assert!(refused(RedlockBuilder::new(["h:0"])));
    assert!(refused(RedlockBuilder::new(["u@h"])));
    assert!(refused(RedlockBuilder::new(["h"]).drift_factor(f64::NAN)));
    assert!(refused(
        RedlockBuilder::new(["h"]).node_timeout(Duration::ZERO)
    ));
    assert!(refused(
        RedlockBuilder::new(["h"]).connect_timeout(Duration::ZERO)
    ));
    assert!(RedlockBuilder::new(["h:1", "a b"]).url().is_none());
}

#[test]
fn debug_hides_the_password() {
    let b = RedlockBuilder::new(["h:1", "h:2"])
        .username("u")
        .password("topsecret");
    let shown = format!("{b:?}");
    assert!(!shown.contains("topsecret"), "{shown}");
    assert_eq!(shown, "RedlockBuilder(redlock://u:***@h:1,h:2)");
    let bad = format!("{:?}", RedlockBuilder::new(["a b"]).password("topsecret"));
    assert!(!bad.contains("topsecret"), "{bad}");
}

fn assert_refused(url: &str, needle: &str) {
    match from(url) {
        Err(Error::InvalidUrl { url: shown, reason }) => {
            assert!(
                reason.contains(needle),
                "{url}: {reason:?} should mention {needle:?}"
            );
            assert!(!shown.contains("hunter2"), "{url}: password in {shown}");
        }
        other => panic!("{url}: expected InvalidUrl, got {other:?}"),
    }
}

#[test]
fn several_hosts_default_port_and_database() {
    let b = from("redlock://h1:1,h2:2,h3:3?drift=0.02").unwrap();
    assert_eq!(b.addrs(), ["h1:1", "h2:2", "h3:3"]);
    assert_eq!(b.get_drift_factor(), 0.02);
    assert_eq!(b.db, 0);
    let b = from("redlock://:pw@a,b:7000,[::1]/5").unwrap();
    assert_eq!(b.addrs(), ["a:6379", "b:7000", "[::1]:6379"]);
    assert_eq!(b.db, 5);
    assert_eq!(b.password.as_deref(), Some("pw"));
    assert_eq!(b.username, None);
    assert_eq!(b.url().unwrap(), "redlock://:pw@a:6379,b:7000,[::1]:6379/5");
}

#[test]
fn refuses_no_host_and_bad_database_index() {
    assert_refused("redlock://?a=b", "redlock:// needs a host");
    assert_refused("redlock://u:hunter2@", "redlock:// needs a host");
    assert_refused("redlock://a,b/db0", "database index");
    assert_refused("redlock://:hunter2@a/x", "database index `x`");
}

/// `?timeout=` takes the CLI's durations.
#[test]
fn timeouts_are_human_durations() {
    let b = from("redlock://h?timeout=1.5ms").unwrap();
    assert_eq!(b.get_node_timeout(), Some(Duration::from_micros(1500)));
    let b = from("redlock://h?timeout=2min").unwrap();
    assert_eq!(b.get_node_timeout(), Some(Duration::from_secs(120)));
    assert_refused("redlock://:hunter2@h?timeout=soon", "parameter `timeout`");
}
