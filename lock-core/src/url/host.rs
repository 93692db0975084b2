//! One entry of a URL's host list ([`Host`]) and a host with its port settled ([`HostPort`]).

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// One entry of a URL's host list as written: a host and the port the URL gives, if any.
///
/// `name` is a host name, an IPv4 address or an IPv6 address; an IPv6 address is stored
/// without brackets and displayed with them (`[::1]:6379`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Host {
    /// Host name or IP address, without brackets.
    pub name: String,
    /// TCP port, 1..=65535, when the URL names one.
    pub port: Option<u16>,
}

impl Host {
    /// Parses one host-list entry: `name[:port]`, `a.b.c.d[:port]` or `[ipv6][:port]`, by the
    /// rules of the [module documentation](super); the error is the reason of the refusal.
    pub fn parse(entry: &str) -> Result<Host, String> {
        if entry.is_empty() {
            return Err("empty host in the host list".to_string());
        }
        if let Some(bracketed) = entry.strip_prefix('[') {
            let Some((address, after)) = bracketed.split_once(']') else {
                return Err(
                    "unterminated `[` (IPv6 hosts are written `[addr]` or `[addr]:port`)"
                        .to_string(),
                );
            };
            if address.parse::<Ipv6Addr>().is_err() {
                return Err(format!("`[{address}]` is not a valid IPv6 address"));
            }
            let port = if after.is_empty() {
                None
            } else if let Some(port) = after.strip_prefix(':') {
                Some(parse_port(port)?)
            } else {
                return Err(format!(
                    "unexpected `{after}` after `[{address}]` (expected `:port`)"
                ));
            };
            return Ok(Host {
                name: address.to_string(),
                port,
            });
        }
        let (name, port) = match entry.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (entry, None),
        };
        if port.is_some_and(|p| p.contains(':')) {
            return Err("IPv6 addresses must be in brackets, e.g. `[::1]:6379`".to_string());
        }
        if name.is_empty() {
            return Err("empty host name before `:`".to_string());
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        {
            return Err(format!(
                "invalid host `{name}` (a host name has only ASCII letters, digits, `-`, `.` and `_`)"
            ));
        }
        if name.contains('.')
            && name.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            && name.parse::<Ipv4Addr>().is_err()
        {
            return Err(format!("`{name}` is not a valid IPv4 address"));
        }
        Ok(Host {
            name: name.to_string(),
            port: port.map(parse_port).transpose()?,
        })
    }

    /// This host with its port, or `default_port` when the URL names none.
    pub fn with_default_port(&self, default_port: u16) -> HostPort {
        HostPort {
            host: self.name.clone(),
            port: self.port.unwrap_or(default_port),
        }
    }
}

impl fmt::Display for Host {
    /// Writes `name` or `name:port`, putting a name that contains `:` (IPv6) in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.contains(':') {
            write!(f, "[{}]", self.name)?;
        } else {
            f.write_str(&self.name)?;
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// `host:port` of one server: a [`Host`] with its port settled, what a backend connects to.
///
/// `host` is a host name, an IPv4 address or an IPv6 address; an IPv6 address is stored
/// without brackets and displayed with them (`[::1]:6379`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// Host name or IP address, without brackets.
    pub host: String,
    /// TCP port, 1..=65535.
    pub port: u16,
}

impl HostPort {
    /// Parses `host`, `host:port` or `[v6]:port` by the host rules of URLs, with
    /// `default_port` when no port is given; the error is the reason of the refusal.
    pub fn parse(addr: &str, default_port: u16) -> Result<HostPort, String> {
        if addr.is_empty() || addr.contains(['@', '/', '?', ',']) {
            return Err("expected `host` or `host:port`".to_owned());
        }
        Host::parse(addr).map(|host| host.with_default_port(default_port))
    }
}

impl fmt::Display for HostPort {
    /// Writes `host:port`, putting a host that contains `:` (IPv6) in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Parses the text after a host's `:`: decimal digits for a port in 1..=65535.
fn parse_port(port: &str) -> Result<u16, String> {
    if port.is_empty() {
        return Err("missing port number after `:`".to_string());
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port `{port}` is not a number"));
    }
    match port.parse::<u16>() {
        Ok(0) => Err("port 0 is not allowed (ports are 1..=65535)".to_string()),
        Ok(port) => Ok(port),
        Err(_) => Err(format!("port `{port}` is out of range 1..=65535")),
    }
}

impl From<HostPort> for Host {
    /// The host with its port written out.
    fn from(host: HostPort) -> Host {
        Host {
            name: host.host,
            port: Some(host.port),
        }
    }
}
