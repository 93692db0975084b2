//! The generic shape of lock-server URLs, through lock-core's public API: accepted forms,
//! one refusal per rule, password redaction, the typed parameters and the duration grammar.
//! Each backend's own rules (default ports, `/db`, one host or several) are tested next to
//! its `from_url`.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use lock_core::url::{
    format_duration, is_secret_param, parse_digits, parse_duration, redact, Host, HostPort,
    UserInfo,
};
use lock_core::{Error, LockUrl};
use proptest::prelude::*;

fn ok(s: &str) -> LockUrl {
    match LockUrl::parse(s) {
        Ok(url) => url,
        Err(err) => panic!("{s:?} should parse, got {err}"),
    }
}

/// Parses `s`, expects `InvalidUrl`, and returns its reason.
fn refused(s: &str) -> String {
    match LockUrl::parse(s) {
        Ok(url) => panic!("{s:?} should be refused, got {url:?}"),
        Err(Error::InvalidUrl { reason, .. }) => reason,
        Err(err) => panic!("{s:?}: expected InvalidUrl, got {err:?}"),
    }
}

fn assert_refused(s: &str, needle: &str) {
    let reason = refused(s);
    assert!(
        reason.contains(needle),
        "{s:?}: reason {reason:?} should mention {needle:?}"
    );
}

fn host(name: &str, port: Option<u16>) -> Host {
    Host {
        name: name.to_string(),
        port,
    }
}

fn hp(host: &str, port: u16) -> HostPort {
    HostPort {
        host: host.to_string(),
        port,
    }
}

fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// ---- scheme and hosts -------------------------------------------------------------------

/// The scheme is an open name, lower-cased; which backend it means is the facade's choice.
#[test]
fn scheme_is_any_name_lower_cased() {
    assert_eq!(ok("memory://").scheme, "memory");
    assert_eq!(ok("REDIS://h").scheme, "redis");
    assert_eq!(ok("Rediss://h").scheme, "rediss");
    assert_eq!(ok("redLock://h").scheme, "redlock");
    assert_eq!(ok("etcd://h").scheme, "etcd");
    assert_eq!(ok("http://localhost").scheme, "http");
    assert_eq!(ok("x+y-z.1://h").scheme, "x+y-z.1");
    assert_eq!(ok("HTTP://h").to_string(), "http://h");
}

#[test]
fn host_display() {
    assert_eq!(hp("localhost", 6379).to_string(), "localhost:6379");
    assert_eq!(hp("::1", 6379).to_string(), "[::1]:6379");
    assert_eq!(hp("10.0.0.1", 1).to_string(), "10.0.0.1:1");
    assert_eq!(host("localhost", None).to_string(), "localhost");
    assert_eq!(host("::1", None).to_string(), "[::1]");
    assert_eq!(host("::1", Some(7)).to_string(), "[::1]:7");
    assert_eq!(host("h", None).with_default_port(6379), hp("h", 6379));
    assert_eq!(host("h", Some(1)).with_default_port(6379), hp("h", 1));
}

#[test]
fn host_port_parses_one_address() {
    assert_eq!(HostPort::parse("h", 6379), Ok(hp("h", 6379)));
    assert_eq!(HostPort::parse("h:7000", 6379), Ok(hp("h", 7000)));
    assert_eq!(HostPort::parse("[::1]:1", 6379), Ok(hp("::1", 1)));
    for bad in [
        "", "a b", "h:0", "h:port", "u@h", "h/1", "h1,h2", "[::1", "h?x",
    ] {
        assert!(HostPort::parse(bad, 6379).is_err(), "{bad:?}");
    }
    assert!(HostPort::parse("h:0", 1).unwrap_err().contains("port 0"));
    assert!(HostPort::parse("u@h", 1).unwrap_err().contains("host:port"));
}

// ---- accepted forms ---------------------------------------------------------------------

#[test]
fn no_host() {
    let url = ok("memory://");
    assert_eq!(url.scheme, "memory");
    assert_eq!(url.userinfo, None);
    assert_eq!(url.username(), None);
    assert_eq!(url.password(), None);
    assert!(url.hosts.is_empty());
    assert_eq!(url.path, "");
    assert!(url.params.is_empty());
    assert_eq!(url.to_string(), "memory://");

    let url = ok("MEMORY://?a=b&c=");
    assert_eq!(url.scheme, "memory");
    assert_eq!(url.params, params(&[("a", "b"), ("c", "")]));
    assert_eq!(url.to_string(), "memory://?a=b&c=");
    assert_eq!(ok("memory://?").params, params(&[]));
    // No host, but user info or a path: the shape allows it, a backend may refuse it.
    assert_eq!(
        ok("memory://@").userinfo,
        UserInfo::from_parts(Some(""), None)
    );
    assert_eq!(ok("memory:///x").path, "/x");
    assert!(ok("redis://").hosts.is_empty());
    assert!(ok("etcd://u:p@").hosts.is_empty());
}

#[test]
fn ports_are_kept_as_written() {
    let url = ok("redis://localhost");
    assert_eq!(url.scheme, "redis");
    assert_eq!(url.hosts, vec![host("localhost", None)]);
    assert_eq!(url.host_ports(6379), vec![hp("localhost", 6379)]);
    assert_eq!(url.userinfo, None);
    assert_eq!(url.path, "");
    assert!(url.params.is_empty());
    assert_eq!(url.to_string(), "redis://localhost");
    assert_eq!(ok("redis://localhost/").path, "/");
    assert_eq!(ok("redis://localhost:6379/?").path, "/");
    assert_eq!(
        ok("redis://localhost:6379").to_string(),
        "redis://localhost:6379"
    );
}

#[test]
fn password_only_path_and_query() {
    let url = ok("redis://:secret@127.0.0.1:6380/2?prefix=app:");
    assert_eq!(url.scheme, "redis");
    assert_eq!(url.username(), None);
    assert_eq!(url.password(), Some("secret"));
    assert_eq!(url.hosts, vec![host("127.0.0.1", Some(6380))]);
    assert_eq!(url.path, "/2");
    assert_eq!(url.params, params(&[("prefix", "app:")]));
    assert_eq!(url.param("prefix"), Some("app:"));
    assert_eq!(
        url.to_string(),
        "redis://:secret@127.0.0.1:6380/2?prefix=app%3A"
    );
    assert_eq!(
        url.redacted(),
        "redis://:***@127.0.0.1:6380/2?prefix=app%3A"
    );
}

#[test]
fn user_and_password() {
    let url = ok("rediss://user:pw@host:6380");
    assert_eq!(url.scheme, "rediss");
    assert_eq!(url.username(), Some("user"));
    assert_eq!(url.password(), Some("pw"));
    assert_eq!(url.hosts, vec![host("host", Some(6380))]);
    assert_eq!(url.path, "");

    let url = ok("redis://user@host");
    assert_eq!(url.username(), Some("user"));
    assert_eq!(url.password(), None);

    let url = ok("redis://user:@host");
    assert_eq!(url.username(), Some("user"));
    assert_eq!(url.password(), Some(""));

    // An empty user info is kept apart from none, but is no user name.
    let url = ok("redis://@host");
    assert_eq!(url.userinfo, UserInfo::from_parts(Some(""), None));
    assert_eq!(url.username(), None);
    assert_eq!(url.to_string(), "redis://@host");
    assert_eq!(UserInfo::from_parts(None, None), None);
}

#[test]
fn userinfo_is_percent_decoded() {
    let url = ok("redis://us%40er:p%3Aa%2Fs%3Fs%23%25%C3%A9@host");
    assert_eq!(url.username(), Some("us@er"));
    assert_eq!(url.password(), Some("p:a/s?s#%é"));
    // A raw `:` in the password and a raw `@` in the user info are understood too.
    let url = ok("redis://u@x:pa:ss@host");
    assert_eq!(url.username(), Some("u@x"));
    assert_eq!(url.password(), Some("pa:ss"));
    assert_eq!(ok(&url.to_string()), url);
}

#[test]
fn several_hosts() {
    let url = ok("redlock://h1:1,h2:2,h3:3?drift=0.02");
    assert_eq!(url.scheme, "redlock");
    assert_eq!(
        url.hosts,
        vec![
            host("h1", Some(1)),
            host("h2", Some(2)),
            host("h3", Some(3))
        ]
    );
    assert_eq!(url.path, "");
    assert_eq!(url.params, params(&[("drift", "0.02")]));
    assert_eq!(url.f64_param("drift").ok(), Some(Some(0.02)));

    let url = ok("redlock://:pw@a,b:7000,[::1]/5");
    assert_eq!(
        url.host_ports(6379),
        vec![hp("a", 6379), hp("b", 7000), hp("::1", 6379)]
    );
    assert_eq!(url.path, "/5");
    assert_eq!(url.to_string(), "redlock://:pw@a,b:7000,[::1]/5");

    let url = ok("etcd://a:2379,b:2379?prefix=x/&timeout=2s");
    assert_eq!(
        url.hosts,
        vec![host("a", Some(2379)), host("b", Some(2379))]
    );
    assert_eq!(url.params, params(&[("prefix", "x/"), ("timeout", "2s")]));
    assert_eq!(
        url.duration_param("timeout").ok(),
        Some(Some(Duration::from_secs(2)))
    );
    let url = ok("etcd://root:pw@etcd-1.internal_x,10.1.2.3/");
    assert_eq!(url.username(), Some("root"));
    assert_eq!(url.password(), Some("pw"));
    assert_eq!(
        url.host_ports(2379),
        vec![hp("etcd-1.internal_x", 2379), hp("10.1.2.3", 2379)]
    );
}

#[test]
fn ipv6_hosts() {
    let url = ok("redis://[::1]:6379");
    assert_eq!(url.hosts, vec![host("::1", Some(6379))]);
    assert_eq!(url.to_string(), "redis://[::1]:6379");
    let url = ok("etcd://[2001:db8::1],[::ffff:10.0.0.1]:2380");
    assert_eq!(
        url.host_ports(2379),
        vec![hp("2001:db8::1", 2379), hp("::ffff:10.0.0.1", 2380)]
    );
}

#[test]
fn path_is_percent_decoded_and_encoded_back() {
    let url = ok("x://h/a%20b/c%3Fd");
    assert_eq!(url.path, "/a b/c?d");
    assert_eq!(url.to_string(), "x://h/a%20b/c%3Fd");
    assert_eq!(ok(&url.to_string()), url);
    assert_eq!(ok("redis://host/1/2").path, "/1/2");
}

#[test]
fn query_is_percent_decoded_and_plus_is_kept() {
    let url = ok("memory://?a%20b=c+d&e=%26%3D&f=x=y&a%20b=2");
    assert_eq!(
        url.params,
        params(&[("a b", "c+d"), ("e", "&="), ("f", "x=y"), ("a b", "2")])
    );
    assert_eq!(url.param("a b"), Some("2"), "last occurrence wins");
    assert_eq!(url.param("missing"), None);
}

#[test]
fn from_str_matches_parse() {
    let url: LockUrl = "redis://localhost".parse().expect("parses");
    assert_eq!(url, ok("redis://localhost"));
    assert!("nope".parse::<LockUrl>().is_err());
}

// ---- refusals, one per rule ---------------------------------------------------------------

#[test]
fn refuses_bad_scheme() {
    assert_refused("://localhost", "empty scheme");
    assert_refused("1redis://h", "invalid scheme `1redis`");
    assert_refused("re_dis://h", "invalid scheme `re_dis`");
    assert_refused("rédis://h", "invalid scheme");
}

#[test]
fn refuses_missing_separator() {
    assert_refused("redis:localhost", "missing `://`");
    assert_refused("redis:/h:6379", "missing `://`");
    assert_refused("localhost:6379", "missing `://`");
    assert_refused("", "missing `://`");
    assert_refused("memory", "missing `://`");
}

#[test]
fn refuses_bad_hosts() {
    assert_refused("redlock://a:1,,b:2", "empty host");
    assert_refused("etcd://a,", "empty host");
    assert_refused("rediss://a,", "empty host");
    assert_refused("redis://:6379", "empty host");
    assert_refused("redis://ho!st", "invalid host `ho!st`");
    assert_refused("redis://hôst", "invalid host");
    assert_refused("redis://h%41st", "invalid host");
    assert_refused("redis://999.1.1.1", "not a valid IPv4 address");
    assert_refused("redis://1.2.3", "not a valid IPv4 address");
    assert_refused("redis://::1", "IPv6 addresses must be in brackets");
    assert_refused("redis://[::1", "unterminated `[`");
    assert_refused("redis://[zz::1]:1", "not a valid IPv6 address");
    assert_refused("redis://[1.2.3.4]", "not a valid IPv6 address");
    assert_refused("redis://[::1]6379", "expected `:port`");
}

#[test]
fn refuses_bad_ports() {
    assert_refused("redis://host:0", "port 0 is not allowed");
    assert_refused("redis://host:abc", "port `abc` is not a number");
    assert_refused("redis://host:+1", "is not a number");
    assert_refused("redis://host:99999", "out of range");
    assert_refused("redis://host:65536", "out of range");
    assert_refused("redis://host:", "missing port");
    assert_refused("redis://[::1]:", "missing port");
    assert_eq!(
        ok("redis://host:65535").hosts,
        vec![host("host", Some(65535))]
    );
}

#[test]
fn refuses_bad_query() {
    assert_refused("redis://h?=v", "empty parameter name");
    assert_refused("redis://h?a=1&", "empty parameter name");
    assert_refused("redis://h?a=1&&b=2", "empty parameter name");
    assert_refused("redis://h?flag", "parameter `flag` has no value");
    assert_refused("redis://h?a=1&flag", "parameter `flag` has no value");
}

#[test]
fn refuses_bad_percent_escapes() {
    assert_refused("redis://h?a=%zz", "invalid percent-escape");
    assert_refused("redis://h?a=%4", "invalid percent-escape");
    assert_refused("redis://h?a=%", "invalid percent-escape");
    assert_refused(
        "redis://h?a%=1",
        "invalid percent-escape in the parameter name",
    );
    assert_refused("redis://u%:p@h", "invalid percent-escape in the user name");
    assert_refused("redis://u:p%g1@h", "invalid percent-escape in the password");
    assert_refused("redis://h/%g1", "invalid percent-escape in the path");
    assert_refused("redis://h?a=%FF", "not valid UTF-8");
    assert_refused("redis://u:%C3@h", "password is not valid UTF-8");
}

#[test]
fn refuses_whitespace_control_and_fragment() {
    assert_refused("redis://host ", "whitespace");
    assert_refused(" redis://host", "whitespace");
    assert_refused("redis://h?a=b c", "whitespace");
    assert_refused("redis://h\u{a0}", "whitespace");
    assert_refused("redis://h\u{7}", "control character U+0007");
    assert_refused("redis://h?a=\u{9f}", "control character");
    assert_refused("redis://host#frag", "`#` fragments are not allowed");
    assert_refused("redis://u:pa#ss@host", "`#`");
}

#[test]
fn refuses_unencoded_at_after_hosts() {
    // A password with a raw `/` or `?` would otherwise be read as a path or a query.
    assert_refused("redis://u:pa/ss@host", "unencoded `@`");
    assert_refused("redis://u:pa?ss@host", "unencoded `@`");
    assert_refused("redis://host?email=a@b", "unencoded `@`");
}

#[test]
fn errors_hide_the_password() {
    let err = LockUrl::parse("redis://u:hunter2@host:bad").expect_err("bad port");
    assert!(matches!(err, Error::InvalidUrl { .. }));
    let display = err.to_string();
    let debug = format!("{err:?}");
    assert!(!display.contains("hunter2"), "{display}");
    assert!(!debug.contains("hunter2"), "{debug}");
    assert!(display.contains("redis://u:***@host:bad"), "{display}");
    assert!(display.contains("port `bad`"), "{display}");

    for input in [
        "redis://u:hunter2/x@host",
        "redis://u:hunter2?x@host",
        "redis://u:hunter2#@host",
        "redis://u:hunter2@host ",
        "redis://u:6379?hunter2@host",
        "redis://u:hunter2%zz@host",
        "redis://u:hunter2@a,,b",
        "1redis://u:hunter2@host",
    ] {
        let err = LockUrl::parse(input).expect_err(input);
        assert!(matches!(err, Error::InvalidUrl { .. }), "{input}");
        assert!(!err.to_string().contains("hunter2"), "{input}: {err}");
        assert!(!format!("{err:?}").contains("hunter2"), "{input}: {err:?}");
    }
    // What a backend refuses after parsing goes through `invalid`, which hides it too.
    let err = ok("redis://u:hunter2@a,b").invalid("one host only");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(err.to_string().contains("one host only"), "{err}");
}

#[test]
fn debug_hides_the_password() {
    let url = ok("rediss://user:hunter2@host:6380/1");
    let debug = format!("{url:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    assert_eq!(debug, "LockUrl(rediss://user:***@host:6380/1)");
    assert!(!format!("{url:#?}").contains("hunter2"));
    assert_eq!(url.redacted(), "rediss://user:***@host:6380/1");
    assert!(url.to_string().contains("hunter2"));
    assert_eq!(ok("redis://user@host").redacted(), "redis://user@host");
    let info = url.userinfo.expect("user info");
    assert!(!format!("{info:?}").contains("hunter2"), "{info:?}");
}

// ---- redact -----------------------------------------------------------------------------

#[test]
fn redact_examples() {
    assert_eq!(redact("redis://u:pw@host"), "redis://u:***@host");
    assert_eq!(redact("redis://:pw@host/0?a=b"), "redis://:***@host/0?a=b");
    assert_eq!(redact("redis://u@host"), "redis://u@host");
    assert_eq!(redact("redis://host:6379"), "redis://host:6379");
    assert_eq!(redact("redis://u:p@ss@host"), "redis://u:***@host");
    assert_eq!(redact("redis://u:p/a?s@host"), "redis://u:***@host");
}

/// A parameter whose name ends in `password` (Sentinel's `sentinel_password`) is a secret
/// too: hidden by `redact`, by `redacted()`, and in the error of a URL that does not parse.
#[test]
fn secret_parameters_are_hidden_everywhere() {
    let raw = "redis+sentinel://:mpw@h1,h2/main?sentinel_password=hunter2&prefix=x";
    assert_eq!(
        redact(raw),
        "redis+sentinel://:***@h1,h2/main?sentinel_password=***&prefix=x"
    );
    assert_eq!(ok(raw).redacted(), redact(raw));
    assert!(!format!("{:?}", ok(raw)).contains("hunter2"));
    // Any case, any position, an `@` or `?` inside the value, no user info.
    assert_eq!(
        redact("x://h/m?a=1&SENTINEL_PASSWORD=p@ss?w&b=2"),
        "x://h/m?a=1&SENTINEL_PASSWORD=***&b=2"
    );
    assert_eq!(redact("x://h?password=s"), "x://h?password=***");
    assert_eq!(redact("x://h?passwords=s&pw=t"), "x://h?passwords=s&pw=t");
    assert!(is_secret_param("sentinel_password") && is_secret_param("Password"));
    assert!(!is_secret_param("password_file") && !is_secret_param("pass"));
    // A URL the parser refuses (a port out of range) names no secret in its error.
    let e = LockUrl::parse("redis+sentinel://h:99999/m?sentinel_password=hunter2").unwrap_err();
    let text = e.to_string();
    assert!(text.contains("sentinel_password=***"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert_eq!(redact("redis:/u:pw@host"), "redis:***@host");
    assert_eq!(redact(""), "");
    assert_eq!(redact("@"), "@");
    assert_eq!(redact(":@"), ":***@");
    assert_eq!(redact("://"), "://");
    assert_eq!(redact("é://ü:ö@ä"), "é://ü:***@ä");
}

// ---- durations --------------------------------------------------------------------------

#[test]
fn parse_duration_accepts() {
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    assert_eq!(parse_duration("0.001ms"), Ok(Duration::from_micros(1)));
    assert_eq!(parse_duration("0.000001ms"), Ok(Duration::from_nanos(1)));
    assert_eq!(parse_duration("0.25m"), Ok(Duration::from_secs(15)));
    assert_eq!(parse_duration("007s"), Ok(Duration::from_secs(7)));
    assert_eq!(parse_duration("1.000000001s"), Ok(Duration::new(1, 1)));
    // The rest of humantime's grammar, as the CLI has always accepted it.
    assert_eq!(parse_duration("2min"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
    assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
    assert_eq!(parse_duration("1 s"), Ok(Duration::from_secs(1)));
    assert_eq!(parse_duration("5µs"), Ok(Duration::from_micros(5)));
    assert_eq!(parse_duration("5us"), Ok(Duration::from_micros(5)));
    assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
    assert_eq!(parse_duration("2 hours"), Ok(Duration::from_secs(7200)));
}

#[test]
fn parse_duration_refuses() {
    let cases = [
        ("", "empty"),
        ("5", "no unit"),
        ("1h 30", "no unit"),
        ("s", "needs a number"),
        ("ms", "needs a number"),
        ("-1s", "needs a number"),
        ("+1s", "needs a number"),
        (".5s", "needs a number"),
        ("1.s", "stray character"),
        ("1..5s", "stray character"),
        ("1.2.3s", "stray character"),
        ("1h-30m", "stray character"),
        ("1x", "unknown unit `x`"),
        ("1S", "unknown unit `S`"),
        ("1e3s", "unknown unit `e`"),
        ("1.5ns", "finer than a nanosecond"),
        ("99999999999999999999999h", "too large"),
        ("999999999999999999999999999999999999999999s", "too large"),
    ];
    for (input, needle) in cases {
        match parse_duration(input) {
            Ok(d) => panic!("{input:?} should be refused, got {d:?}"),
            Err(reason) => {
                assert!(reason.contains(needle), "{input:?}: {reason}");
                assert!(reason.contains("like 30s"), "{input:?}: {reason}");
            }
        }
    }
}

#[test]
fn format_duration_round_trips() {
    for d in [
        Duration::from_secs(2),
        Duration::from_millis(250),
        Duration::from_micros(1500),
        Duration::from_nanos(1),
        Duration::from_nanos(1_000_001_000),
        Duration::ZERO,
        Duration::MAX,
        Duration::new(u64::MAX / 1_000_000_000 + 1, 5),
    ] {
        assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{d:?}");
    }
    assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    assert_eq!(format_duration(Duration::from_micros(1500)), "1.5ms");
    assert_eq!(format_duration(Duration::from_secs(120)), "120s");
}

// ---- parameter helpers ------------------------------------------------------------------

fn reason(err: Error) -> String {
    match err {
        Error::InvalidUrl { reason, url } => {
            assert!(!url.contains("hunter2"), "{url}");
            reason
        }
        other => panic!("expected InvalidUrl, got {other:?}"),
    }
}

#[test]
fn check_params_names_unknown_ones() {
    let url = ok("redis://:hunter2@h?prefix=a&ttl=1s&bogus=1");
    assert!(url.check_params(&["prefix", "ttl", "bogus"]).is_ok());
    let err = url.check_params(&["prefix", "ttl"]).expect_err("bogus");
    assert!(matches!(err, Error::InvalidUrl { .. }));
    assert!(!err.to_string().contains("hunter2"));
    assert_eq!(
        reason(err),
        "unknown parameter `bogus` (known: prefix, ttl)"
    );
    let err = url.check_params(&[]).expect_err("none known");
    assert_eq!(reason(err), "unknown parameter `prefix` (known: none)");
    assert!(ok("redis://h").check_params(&[]).is_ok());
}

#[test]
fn duration_param() {
    let url = ok("redis://:hunter2@h?timeout=2s&bad=2&worse=soon");
    assert_eq!(
        url.duration_param("timeout").ok(),
        Some(Some(Duration::from_secs(2)))
    );
    assert_eq!(url.duration_param("absent").ok(), Some(None));
    let reason_bad = reason(url.duration_param("bad").expect_err("no unit"));
    assert!(reason_bad.contains("parameter `bad`"), "{reason_bad}");
    assert!(reason_bad.contains("no unit"), "{reason_bad}");
    let reason_worse = reason(url.duration_param("worse").expect_err("junk"));
    assert!(reason_worse.contains("parameter `worse`"), "{reason_worse}");
}

/// A URL's durations are the CLI's: `?timeout=2min` means what `--ttl 2min` means.
#[test]
fn duration_params_use_the_humantime_grammar() {
    let url = ok("etcd://h?a=2min&b=1h%2030m&c=1h30m&d=1.5s&e=250ms&f=0");
    let get = |name| url.duration_param(name).ok().flatten();
    assert_eq!(get("a"), Some(Duration::from_secs(120)));
    assert_eq!(get("b"), Some(Duration::from_secs(5400)));
    assert_eq!(get("c"), Some(Duration::from_secs(5400)));
    assert_eq!(get("d"), Some(Duration::from_millis(1500)));
    assert_eq!(get("e"), Some(Duration::from_millis(250)));
    assert_eq!(get("f"), Some(Duration::ZERO));
    for (query, needle) in [
        ("timeout=2", "no unit"),
        ("timeout=2parsecs", "unknown unit `parsecs`"),
        ("timeout=-2s", "needs a number"),
        ("timeout=", "empty"),
    ] {
        let url = ok(&format!("redis://:hunter2@h?{query}"));
        let r = reason(url.duration_param("timeout").expect_err(query));
        assert!(r.starts_with("parameter `timeout`: "), "{query}: {r}");
        assert!(r.contains(needle), "{query}: {r}");
    }
}

#[test]
fn f64_param() {
    let url = ok("redlock://a?drift=0.01&neg=-1.5&exp=1e-3&inf=inf&nan=NaN&word=abc");
    assert_eq!(url.f64_param("drift").ok(), Some(Some(0.01)));
    assert_eq!(url.f64_param("neg").ok(), Some(Some(-1.5)));
    assert_eq!(url.f64_param("exp").ok(), Some(Some(0.001)));
    assert_eq!(url.f64_param("absent").ok(), Some(None));
    for name in ["inf", "nan", "word"] {
        let r = reason(url.f64_param(name).expect_err(name));
        assert!(r.contains(&format!("parameter `{name}`")), "{r}");
        assert!(r.contains("finite number"), "{r}");
    }
}

#[test]
fn u64_param() {
    let url = ok(concat!(
        "etcd://a?n=42&max=18446744073709551615",
        "&over=18446744073709551616&neg=-1&plus=%2B1&f=1.5"
    ));
    assert_eq!(url.u64_param("n").ok(), Some(Some(42)));
    assert_eq!(url.u64_param("max").ok(), Some(Some(u64::MAX)));
    assert_eq!(url.u64_param("absent").ok(), Some(None));
    for name in ["over", "neg", "plus", "f"] {
        let r = reason(url.u64_param(name).expect_err(name));
        assert!(r.contains(&format!("parameter `{name}`")), "{r}");
    }
    assert_eq!(parse_digits::<u32>("4294967295"), Some(u32::MAX));
    assert_eq!(parse_digits::<u32>("4294967296"), None);
    assert_eq!(parse_digits::<u32>("+1"), None);
    assert_eq!(parse_digits::<u32>(""), None);
}

#[test]
fn bool_param() {
    let url = ok("redlock://a?on=true&off=false&yes=yes&caps=TRUE");
    assert_eq!(url.bool_param("on").ok(), Some(Some(true)));
    assert_eq!(url.bool_param("off").ok(), Some(Some(false)));
    assert_eq!(url.bool_param("absent").ok(), Some(None));
    for name in ["yes", "caps"] {
        let r = reason(url.bool_param(name).expect_err(name));
        assert!(r.contains(&format!("parameter `{name}`")), "{r}");
        assert!(r.contains("`true` or `false`"), "{r}");
    }
}

// ---- property tests ---------------------------------------------------------------------

fn host_strategy() -> impl Strategy<Value = Host> {
    let name = prop_oneof![
        "[a-zA-Z_][a-zA-Z0-9_-]{0,10}(\\.[a-zA-Z0-9_-]{1,8}){0,3}",
        "[0-9]{1,6}",
        any::<Ipv4Addr>().prop_map(|ip| ip.to_string()),
        any::<Ipv6Addr>().prop_map(|ip| ip.to_string()),
    ];
    (name, proptest::option::of(1..=u16::MAX)).prop_map(|(name, port)| Host { name, port })
}

fn lock_url_strategy() -> impl Strategy<Value = LockUrl> {
    let userinfo = proptest::option::of((any::<String>(), any::<Option<String>>()))
        .prop_map(|info| info.map(|(username, password)| UserInfo { username, password }));
    let path = prop_oneof![
        Just(String::new()),
        any::<String>().prop_map(|p| format!("/{p}")),
    ];
    (
        "[a-zA-Z][a-zA-Z0-9+.-]{0,8}",
        userinfo,
        proptest::collection::vec(host_strategy(), 0..5),
        path,
        proptest::collection::vec((".+", any::<String>()), 0..4),
    )
        .prop_map(|(scheme, userinfo, hosts, path, params)| LockUrl {
            scheme: scheme.to_ascii_lowercase(),
            userinfo,
            hosts,
            path,
            params,
        })
}

/// Parses junk: never panics, refusals are `InvalidUrl`, and anything accepted prints
/// back to text that parses to the same value.
fn check_junk(input: &str) -> Result<(), TestCaseError> {
    match LockUrl::parse(input) {
        Ok(url) => {
            let text = url.to_string();
            prop_assert_eq!(LockUrl::parse(&text).ok(), Some(url.clone()), "{}", text);
            prop_assert_eq!(redact(&text), url.redacted());
        }
        Err(err) => prop_assert!(matches!(err, Error::InvalidUrl { .. }), "{:?}", err),
    }
    let _ = redact(input);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn round_trip(url in lock_url_strategy()) {
        let text = url.to_string();
        let parsed = LockUrl::parse(&text);
        prop_assert!(parsed.is_ok(), "{:?} -> {:?}", text, parsed);
        prop_assert_eq!(parsed.ok(), Some(url.clone()));
        prop_assert_eq!(text.parse::<LockUrl>().ok(), Some(url.clone()));
        prop_assert_eq!(redact(&text), url.redacted());
    }

    #[test]
    fn junk_any_string(input in ".*") {
        check_junk(&input)?;
    }

    #[test]
    fn junk_url_characters(input in "[a-z:/@?&=%\\[\\],.0-9]{0,40}") {
        check_junk(&input)?;
    }

    #[test]
    fn junk_after_scheme(
        scheme in "(memory|redis|rediss|redlock|etcd|REDIS|x)",
        rest in "[a-z:/@?&=%\\[\\],.0-9A-F]{0,40}",
    ) {
        check_junk(&format!("{scheme}://{rest}"))?;
    }

    #[test]
    fn redact_hides_generated_passwords(
        url in lock_url_strategy(),
        user in any::<String>(),
        secret in any::<String>(),
    ) {
        let mut url = url;
        let password = format!("SECRET{secret}");
        url.userinfo = Some(UserInfo { username: user, password: Some(password.clone()) });
        let text = url.to_string();
        let redacted = redact(&text);
        prop_assert!(!redacted.contains("SECRET"), "{}", redacted);
        prop_assert_eq!(&redacted, &url.redacted());
        let debug = format!("{url:?}");
        prop_assert!(!debug.contains("SECRET"), "{}", debug);
    }

    #[test]
    fn redact_hides_raw_passwords(
        scheme in "[a-z]{1,8}",
        user in "[^:]*",
        secret in any::<String>(),
        tail in "[^@]*",
    ) {
        let password = format!("SECRET{secret}");
        let input = format!("{scheme}://{user}:{password}@{tail}");
        let redacted = redact(&input);
        prop_assert_eq!(&redacted, &format!("{scheme}://{user}:***@{tail}"));
        if let Err(err) = LockUrl::parse(&input) {
            prop_assert!(matches!(err, Error::InvalidUrl { .. }), "{:?}", err);
            if let Error::InvalidUrl { url, .. } = &err {
                prop_assert!(!url.contains(&password), "{}", url);
            }
        }
    }

    #[test]
    fn redact_never_panics(input in any::<String>()) {
        let _ = redact(&input);
    }

    #[test]
    fn parse_duration_never_panics(input in "[0-9.a-zµ ]{0,30}|.*") {
        let _ = parse_duration(&input);
    }

    #[test]
    fn parse_duration_millis_round_trip(ms in 0u64..=u64::MAX / 1_000_000) {
        prop_assert_eq!(parse_duration(&format!("{ms}ms")), Ok(Duration::from_millis(ms)));
    }

    #[test]
    fn format_duration_round_trip(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
        let d = Duration::new(secs, nanos);
        prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{}", format_duration(d));
    }

    #[test]
    fn format_duration_round_trip_small(nanos in any::<u64>()) {
        let d = Duration::from_nanos(nanos);
        prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{}", format_duration(d));
    }
}
