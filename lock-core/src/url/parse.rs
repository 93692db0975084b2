//! The parser behind [`LockUrl::parse`](super::LockUrl::parse): the generic shape, no
//! scheme's own rules. It splits the text into [`Parts`], which the parent module turns
//! into a `LockUrl`, so that this module depends only on [`Host`] and the percent coding.

use std::str::FromStr;

use super::host::Host;
use super::percent::decode;

/// A URL split into its parts, each checked and percent-decoded.
pub(super) struct Parts {
    /// Lower-cased.
    pub(super) scheme: String,
    /// User name and optional password, when the URL has an `@`.
    pub(super) userinfo: Option<(String, Option<String>)>,
    pub(super) hosts: Vec<Host>,
    /// Empty, or starting with `/`.
    pub(super) path: String,
    pub(super) params: Vec<(String, String)>,
}

/// Splits `s` into its parts, or returns the reason of the refusal.
pub(super) fn split(s: &str) -> Result<Parts, String> {
    if s.chars().any(char::is_whitespace) {
        return Err("whitespace is not allowed in a lock URL".to_string());
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(format!(
            "control character U+{:04X} is not allowed in a lock URL",
            u32::from(c)
        ));
    }
    if s.contains('#') {
        return Err(
            "`#` fragments are not allowed (percent-encode `#` as %23 in a password or parameter)"
                .to_string(),
        );
    }
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err(
            "missing `://` after the scheme (expected e.g. `redis://localhost:6379`)".to_string(),
        );
    };
    let scheme = parse_scheme(scheme)?;

    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => before_query.split_at(i),
        None => (before_query, ""),
    };
    if path.contains('@') || query.is_some_and(|q| q.contains('@')) {
        return Err(
            "unencoded `@` after the host list; percent-encode `@`, `/`, `?` and `#` \
                    in user names, passwords and parameters (as %40, %2F, %3F, %23)"
                .to_string(),
        );
    }
    let (userinfo, hostlist) = match authority.rsplit_once('@') {
        Some((userinfo, hostlist)) => (Some(parse_userinfo(userinfo)?), hostlist),
        None => (None, authority),
    };
    let hosts = if hostlist.is_empty() {
        Vec::new()
    } else {
        hostlist
            .split(',')
            .map(Host::parse)
            .collect::<Result<Vec<_>, _>>()?
    };
    Ok(Parts {
        scheme,
        userinfo,
        hosts,
        path: decode(path, "path")?,
        params: parse_query(query.unwrap_or(""))?,
    })
}

/// Checks the text before `://` and lower-cases it.
fn parse_scheme(scheme: &str) -> Result<String, String> {
    let mut chars = scheme.chars();
    match chars.next() {
        None => Err("empty scheme before `://` (expected e.g. `redis://localhost:6379`)".into()),
        Some(first)
            if first.is_ascii_alphabetic()
                && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) =>
        {
            Ok(scheme.to_ascii_lowercase())
        }
        Some(_) => Err(format!(
            "invalid scheme `{scheme}` (a scheme is an ASCII letter followed by letters, \
             digits, `+`, `-` or `.`)"
        )),
    }
}

/// Splits `user[:password]` at the first `:` and decodes both parts.
fn parse_userinfo(userinfo: &str) -> Result<(String, Option<String>), String> {
    let (user, password) = match userinfo.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (userinfo, None),
    };
    Ok((
        decode(user, "user name")?,
        password.map(|p| decode(p, "password")).transpose()?,
    ))
}

/// Parses the query (the text after `?`) into percent-decoded `(name, value)` pairs.
fn parse_query(query: &str) -> Result<Vec<(String, String)>, String> {
    if query.is_empty() {
        return Ok(Vec::new());
    }
    query
        .split('&')
        .map(|pair| {
            let Some((key, value)) = pair.split_once('=') else {
                if pair.is_empty() {
                    return Err("empty parameter name (stray `&`)".to_string());
                }
                let key = decode(pair, "parameter name")?;
                return Err(format!(
                    "parameter `{key}` has no value (write `{key}=value`)"
                ));
            };
            let key = decode(key, "parameter name")?;
            if key.is_empty() {
                return Err("empty parameter name before `=`".to_string());
            }
            let value = decode(value, &format!("value of parameter `{key}`"))?;
            Ok((key, value))
        })
        .collect()
}

/// Parses a non-empty string of ASCII digits (no sign, no spaces) as `T`; `None` for
/// anything else or on overflow. The number rule of
/// [`LockUrl::u64_param`](super::LockUrl::u64_param), for backends
/// reading a number elsewhere in a URL (a `/db` path).
pub fn parse_digits<T: FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}
