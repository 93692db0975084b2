//! `redis+sentinel://`: the URL's rules, the builder, the round trip, hidden passwords.

use std::time::Duration;

use lock_core::{Error, LockUrl, Result};

use super::*;

fn from(url: &str) -> Result<RedisBuilder> {
    RedisBuilder::from_url(&LockUrl::parse(url)?)
}

fn sentinels(b: &RedisBuilder) -> Vec<String> {
    match &b.sentinel_config().expect("sentinel mode").sentinels {
        Ok(list) => list.iter().map(ToString::to_string).collect(),
        Err(e) => panic!("bad sentinels {e:?}"),
    }
}

#[test]
fn urls_give_the_sentinels_the_master_and_the_rest() {
    let b = from("redis+sentinel://127.0.0.1:26380,10.0.0.2/locks").unwrap();
    assert_eq!(sentinels(&b), ["127.0.0.1:26380", "10.0.0.2:26379"]);
    assert_eq!(b.sentinel_master(), Some("locks"));
    assert_eq!(b.get_database(), 0);
    assert_eq!(b.get_prefix(), "distlock:");
    assert_eq!(b.get_timeout(), Duration::from_secs(1));
    assert_eq!(b.credentials(), (None, None));

    let b = from(
        "redis+sentinel://alice:p%40ss@h1:1,h2:2,[::1]/mymaster/3?prefix=app%3A&timeout=250ms\
         &sentinel_user=watcher&sentinel_password=s%26s",
    )
    .unwrap();
    assert_eq!(sentinels(&b), ["h1:1", "h2:2", "[::1]:26379"]);
    assert_eq!(b.sentinel_master(), Some("mymaster"));
    assert_eq!(b.get_database(), 3);
    assert_eq!(b.get_prefix(), "app:");
    assert_eq!(b.get_timeout(), Duration::from_millis(250));
    assert_eq!(b.credentials(), (Some("alice"), Some("p@ss")));
    let config = b.sentinel_config().unwrap();
    assert_eq!(config.username.as_deref(), Some("watcher"));
    assert_eq!(config.password.as_deref(), Some("s&s"));
}

#[test]
fn bad_urls_are_invalid_url_errors() {
    for (url, needle) in [
        ("redis+sentinel://", "at least one sentinel"),
        ("redis+sentinel://h1,h2", "master name"),
        ("redis+sentinel://h1,h2/", "master name"),
        ("redis+sentinel://h1/m/x", "database index `x`"),
        ("redis+sentinel://h1/m/1/2", "database index"),
        ("redis+sentinel://h1:99999/m", "port"),
        ("redis+sentinel://h1/m?foo=1", "unknown parameter `foo`"),
        ("redis+sentinel://h1/m?timeout=0s", "greater than zero"),
        ("redis+sentinel://h1/m?timeout=soon", "timeout"),
        (
            "redis+sentinel://:secret@h1/m?sentinel_password=secret&bogus=1",
            "bogus",
        ),
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
fn builder_setters_and_round_trip() {
    let b = RedisBuilder::sentinel(["10.0.0.1", "10.0.0.2:26380"], "locks")
        .username("bob")
        .password("hunter2")
        .sentinel_password("s3")
        .database(7)
        .prefix("x:")
        .timeout(Duration::from_millis(1500));
    assert!(b.check().is_ok());
    let url = b.url().unwrap();
    assert_eq!(
        url,
        "redis+sentinel://bob:hunter2@10.0.0.1:26379,10.0.0.2:26380/locks/7\
         ?prefix=x%3A&timeout=1500ms&sentinel_password=s3"
    );
    assert_eq!(from(&url).unwrap(), b);
    let plain = RedisBuilder::sentinel(["s"], "m");
    assert_eq!(plain.url().unwrap(), "redis+sentinel://s:26379/m");
    assert_eq!(from(&plain.url().unwrap()).unwrap(), plain);
}

#[test]
fn passwords_are_hidden() {
    let b = RedisBuilder::sentinel(["h:1"], "m")
        .password("topsecret")
        .sentinel_password("alsosecret");
    let shown = format!("{b:?}");
    assert!(!shown.contains("secret"), "{shown}");
    assert_eq!(
        shown,
        "RedisBuilder(redis+sentinel://:***@h:1/m?sentinel_password=***)"
    );
}

#[test]
fn bad_builders_are_reported_by_check() {
    let no_sentinel = RedisBuilder::sentinel(Vec::<String>::new(), "m");
    let bad_addr = RedisBuilder::sentinel(["h:1", "a b"], "m");
    let no_master = RedisBuilder::sentinel(["h"], "");
    let tls = RedisBuilder::sentinel(["h"], "m").tls(true);
    for (b, needle) in [
        (&no_sentinel, "at least one sentinel"),
        (&bad_addr, "sentinel address `a b`"),
        (&no_master, "master name"),
        (&tls, "TLS"),
    ] {
        match b.check() {
            Err(Error::InvalidUrl { reason, .. }) => assert!(reason.contains(needle), "{reason}"),
            other => panic!("{b:?}: expected InvalidUrl, got {other:?}"),
        }
    }
    assert!(bad_addr.url().is_none());
    assert!(format!("{bad_addr:?}").contains("invalid sentinel address"));
}

#[test]
fn setters_for_sentinels_leave_a_direct_configuration_alone() {
    let b = RedisBuilder::new("h")
        .sentinel_password("x")
        .sentinel_username("u");
    assert_eq!(b, RedisBuilder::new("h"));
    assert_eq!(b.sentinel_master(), None);
}

#[test]
fn replies_are_read() {
    let addr = Value::Array(vec![
        Value::BulkString(b"127.0.0.1".to_vec()),
        Value::BulkString(b"6380".to_vec()),
    ]);
    assert_eq!(master_addr(&addr), Some(("127.0.0.1".to_owned(), 6380)));
    assert_eq!(master_addr(&Value::Nil), None);
    let role = Value::Array(vec![Value::BulkString(b"slave".to_vec()), Value::Int(1)]);
    assert_eq!(role_name(&role).as_deref(), Some("slave"));
}
