//! `RedisBuilder`: the rules of `redis://` and `rediss://` URLs, the typed setters, and the
//! round trip between them.

use super::*;

fn from(url: &str) -> Result<RedisBuilder> {
    RedisBuilder::from_url(&LockUrl::parse(url)?)
}

#[test]
fn urls_give_the_configuration() {
    let b = from("redis://127.0.0.1:7000").unwrap();
    assert_eq!(b.host_port().unwrap().to_string(), "127.0.0.1:7000");
    assert!(!b.is_tls());
    assert_eq!(b.credentials(), (None, None));
    assert_eq!(b.get_database(), 0);
    assert_eq!(b.get_prefix(), "distlock:");
    assert_eq!(b.get_timeout(), Duration::from_secs(1));

    let b = from("redis://alice:p%40ss@cache.example:6380/3?prefix=app%3Alocks%3A&timeout=250ms")
        .unwrap();
    assert!(!b.is_tls());
    assert_eq!(b.credentials(), (Some("alice"), Some("p@ss")));
    assert_eq!(b.host_port().unwrap().to_string(), "cache.example:6380");
    assert_eq!(b.get_database(), 3);
    assert_eq!(b.get_prefix(), "app:locks:");
    assert_eq!(b.get_timeout(), Duration::from_millis(250));

    let b = from("redis://[::1]").unwrap();
    assert_eq!(b.host_port().unwrap().to_string(), "[::1]:6379");
    let b = from("redis://h?prefix=").unwrap();
    assert_eq!(b.get_prefix(), "");
}

#[test]
fn bad_urls_are_invalid_url_errors() {
    for (url, needle) in [
        ("redis://h?foo=1", "unknown parameter `foo`"),
        ("redis://h?timeout=abc", "timeout"),
        ("redis://h?timeout=5", "no unit"),
        ("redis://h?timeout=0ms", "greater than zero"),
        ("redis://h1,h2", "redlock"),
        ("redis://h:99999", "port"),
        ("redis://h/notanumber", ""),
        ("memory://", "redis:// or rediss://"),
        ("etcd://h:2379", "redis:// or rediss://"),
        ("redis://:secret@h?bogus=1", "bogus"),
    ] {
        match from(url) {
            Err(Error::InvalidUrl { url: shown, reason }) => {
                assert!(reason.contains(needle), "{url}: {reason}");
                assert!(
                    !shown.contains("secret"),
                    "{url}: password shown in {shown}"
                );
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
}

#[test]
fn builder_setters_and_round_trip() {
    let b = RedisBuilder::new("10.0.0.5:6390")
        .username("bob")
        .password("hunter2")
        .database(7)
        .prefix("x:")
        .timeout(Duration::from_micros(1500));
    assert!(b.check().is_ok());
    let url = b.url().unwrap();
    assert_eq!(
        url,
        "redis://bob:hunter2@10.0.0.5:6390/7?prefix=x%3A&timeout=1.5ms"
    );
    assert_eq!(from(&url).unwrap(), b);
    let plain = RedisBuilder::new("localhost");
    assert_eq!(plain.url().unwrap(), "redis://localhost:6379");
    assert_eq!(from(&plain.url().unwrap()).unwrap(), plain);
}

/// `rediss://` gives a TLS configuration, or a clear refusal without the `tls` feature.
#[test]
fn rediss_means_tls() {
    let url = "rediss://alice:pw@cache.example:6380/3";
    let built = RedisBuilder::new("cache.example:6380")
        .username("alice")
        .password("pw")
        .database(3)
        .tls(true);
    assert_eq!(built.url().unwrap(), url);
    #[cfg(feature = "tls")]
    {
        let b = from(url).unwrap();
        assert!(b.is_tls());
        assert_eq!(b, built);
        assert!(built.check().is_ok());
    }
    #[cfg(not(feature = "tls"))]
    for result in [from(url), built.check().map(|()| built.clone())] {
        match result {
            Err(Error::InvalidUrl { reason, .. }) => assert!(reason.contains("`tls`")),
            other => panic!("expected InvalidUrl, got {other:?}"),
        }
    }
}

/// `ca`, `cert` and `key` on `rediss://` give the TLS files, survive the round trip to a
/// URL, and are refused on `redis://` or apart.
#[cfg(feature = "tls")]
#[test]
fn tls_files_from_urls_and_setters() {
    let url = "rediss://cache.example:6380?ca=%2Fetc%2Fca.pem&cert=%2Fc.pem&key=%2Fk.pem";
    let b = from(url).unwrap();
    assert_eq!(b.get_ca_file(), Some(Path::new("/etc/ca.pem")));
    assert_eq!(
        b.get_client_cert(),
        Some((Path::new("/c.pem"), Path::new("/k.pem")))
    );
    let built = RedisBuilder::new("cache.example:6380")
        .tls(true)
        .ca_file("/etc/ca.pem")
        .client_cert("/c.pem", "/k.pem");
    assert_eq!(b, built);
    assert_eq!(from(&built.url().unwrap()).unwrap(), built);
    for (url, needle) in [
        ("redis://h?ca=%2Fca.pem", "needs TLS"),
        ("rediss://h?cert=%2Fc.pem", "go together"),
        ("rediss://h?key=%2Fk.pem", "go together"),
    ] {
        match from(url) {
            Err(Error::InvalidUrl { reason, .. }) => {
                assert!(reason.contains(needle), "{url}: {reason}")
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
    assert!(RedisBuilder::new("h").ca_file("/ca.pem").check().is_err());
}

#[test]
fn bad_addresses_and_timeouts_are_reported_by_check() {
    for addr in [
        "",
        "a b",
        "host:0",
        "host:port",
        "user@host",
        "h/1",
        "h1,h2",
        "[::1",
    ] {
        match RedisBuilder::new(addr).check() {
            Err(Error::InvalidUrl { .. }) => {}
            other => panic!("{addr:?}: expected InvalidUrl, got {other:?}"),
        }
        assert!(RedisBuilder::new(addr).url().is_none());
        assert!(format!("{:?}", RedisBuilder::new(addr)).contains("invalid address"));
    }
    assert!(matches!(
        RedisBuilder::new("h").timeout(Duration::ZERO).check(),
        Err(Error::InvalidUrl { .. })
    ));
}

#[test]
fn debug_hides_the_password() {
    let b = RedisBuilder::new("h:1").username("u").password("topsecret");
    let shown = format!("{b:?}");
    assert!(!shown.contains("topsecret"), "{shown}");
    assert!(shown.contains("u:***@h:1"), "{shown}");
    let b = from("redis://:topsecret@h:1/2?timeout=2s").unwrap();
    let shown = format!("{b:?}");
    assert!(!shown.contains("topsecret"), "{shown}");
    assert_eq!(shown, r#"RedisBuilder(redis://:***@h:1/2?timeout=2s)"#);
}

#[test]
fn durations_format_back_exactly() {
    for d in [
        Duration::from_secs(2),
        Duration::from_millis(250),
        Duration::from_micros(1500),
        Duration::from_nanos(1),
        Duration::from_nanos(1_000_001_000),
    ] {
        let text = format_duration(d);
        assert_eq!(lock_core::url::parse_duration(&text), Ok(d), "{text}");
    }
}

/// The reason of the `InvalidUrl` refusing `url`, checking that it hides the password.
fn reason(url: &str) -> String {
    match from(url) {
        Err(Error::InvalidUrl { url: shown, reason }) => {
            assert!(!shown.contains("hunter2"), "{url}: password in {shown}");
            reason
        }
        other => panic!("{url}: expected InvalidUrl, got {other:?}"),
    }
}

fn assert_refused(url: &str, needle: &str) {
    let reason = reason(url);
    assert!(
        reason.contains(needle),
        "{url}: {reason:?} should mention {needle:?}"
    );
}

#[test]
fn default_port_and_no_database() {
    let b = from("redis://localhost").unwrap();
    assert_eq!(
        b.host_port().unwrap(),
        &HostPort::parse("localhost:6379", 1).unwrap()
    );
    assert_eq!(b.url().unwrap(), "redis://localhost:6379");
    assert_eq!(from("redis://localhost/").unwrap().get_database(), 0);
    assert_eq!(from("redis://localhost:6379/?").unwrap().get_database(), 0);
    let shown = format!("{:?}", from("redis://user@host").unwrap());
    assert_eq!(shown, "RedisBuilder(redis://user@host:6379)");
}

#[test]
fn password_only_database_and_query() {
    let b = from("redis://:secret@127.0.0.1:6380/2?prefix=app:").unwrap();
    assert_eq!(b.credentials(), (None, Some("secret")));
    assert_eq!(b.host_port().unwrap().to_string(), "127.0.0.1:6380");
    assert_eq!(b.get_database(), 2);
    assert_eq!(b.get_prefix(), "app:");
    assert_eq!(
        b.url().unwrap(),
        "redis://:secret@127.0.0.1:6380/2?prefix=app%3A"
    );
    assert_eq!(b.redacted(), "redis://:***@127.0.0.1:6380/2?prefix=app%3A");
    let b = from("redis://user:@host").unwrap();
    assert_eq!(b.credentials(), (Some("user"), Some("")));
    let b = from("redis://@host").unwrap();
    assert_eq!(b.credentials(), (None, None));
}

#[test]
fn refuses_no_host_or_several() {
    assert_refused("redis://", "redis:// needs a host");
    assert_refused("redis://u:hunter2@", "redis:// needs a host");
    assert_refused(
        "redis://a:1,b:2",
        "redis:// names one host; use redlock:// for several nodes",
    );
    assert_refused("rediss://a,b", "rediss:// names one host");
    assert_refused("redis://u:hunter2@a,b", "use redlock://");
}

#[test]
fn refuses_bad_database_index() {
    assert_refused("redis://host/x", "database index `x`");
    assert_refused("redis://host/-1", "database index");
    assert_refused("redis://host/+1", "database index");
    assert_refused("redis://host/4294967296", "database index");
    assert_refused("redis://host/1/2", "database index");
    assert_refused("redis://u:hunter2@host/x", "database index");
    assert_eq!(
        from("redis://host/4294967295").unwrap().get_database(),
        u32::MAX
    );
}

/// `?timeout=` takes the CLI's durations: `2min`, `1h 30m`.
#[test]
fn timeouts_are_human_durations() {
    let timeout = |url: &str| from(url).unwrap().get_timeout();
    assert_eq!(timeout("redis://h?timeout=2min"), Duration::from_secs(120));
    assert_eq!(
        timeout("redis://h?timeout=1h%2030m"),
        Duration::from_secs(5400)
    );
    assert_eq!(
        timeout("redis://h?timeout=1.5s"),
        Duration::from_millis(1500)
    );
    let r = reason("redis://:hunter2@h?timeout=2parsecs");
    assert!(
        r.contains("parameter `timeout`") && r.contains("unknown unit"),
        "{r}"
    );
    assert_refused("redis://h?timeout=0", "greater than zero");
}

#[test]
fn cluster_urls_give_seed_nodes_and_round_trip() {
    let b = from("redis+cluster://u:pw@a,b:7001,[::1]:7002?prefix=x%3A&timeout=250ms").unwrap();
    assert!(b.is_cluster());
    let seeds: Vec<String> = b.seed_nodes().iter().map(ToString::to_string).collect();
    assert_eq!(seeds, ["a:6379", "b:7001", "[::1]:7002"]);
    assert_eq!(b.host_port().unwrap().to_string(), "a:6379");
    assert_eq!(b.credentials(), (Some("u"), Some("pw")));
    assert_eq!((b.get_database(), b.get_prefix()), (0, "x:"));
    assert_eq!(b.get_timeout(), Duration::from_millis(250));
    assert!(!b.is_grouping(), "grouping is off by default on a cluster");
    assert_eq!(from(&b.url().unwrap()).unwrap(), b);
    assert!(!format!("{b:?}").contains("pw"));
    // One seed is accepted: it finds the rest of the cluster.
    assert_eq!(from("redis+cluster://h").unwrap().seed_nodes().len(), 1);
    assert!(!from("redis://h").unwrap().is_cluster());
    assert!(from("redis://h").unwrap().is_grouping());
}

#[test]
fn bad_cluster_urls_are_invalid_url_errors() {
    for (url, needle) in [
        ("redis+cluster://h/0", "only database 0"),
        ("redis+cluster://h/3", "only database 0"),
        ("redis+cluster://h?foo=1", "unknown parameter `foo`"),
        ("redis+cluster://", "at least one seed"),
    ] {
        match from(url) {
            Err(Error::InvalidUrl { reason, .. }) => {
                assert!(reason.contains(needle), "{url}: {reason}")
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
    for (builder, needle) in [
        (RedisBuilder::cluster(["h"]).database(1), "only database 0"),
        (RedisBuilder::cluster(["h"]).tls(true), "TLS"),
        (RedisBuilder::cluster(["h", "bad:port"]), "port"),
    ] {
        match builder.check() {
            Err(Error::InvalidUrl { reason, .. }) => assert!(reason.contains(needle), "{reason}"),
            other => panic!("expected InvalidUrl, got {other:?}"),
        }
    }
}
