//! `run --metrics-push URL`: the run's metrics sent to a Prometheus Pushgateway at exit,
//! as the group `job=NAME`.
//!
//! A run that succeeded replaces the whole group (HTTP PUT): the group is then exactly this
//! run's. A run that did not succeed sends a POST, which replaces only the metrics it
//! carries: the group keeps `distlock_run_last_success_timestamp_seconds` of the last run
//! that succeeded, the series to alert on (the Pushgateway adds its own
//! `push_time_seconds`).

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{header, Method, Request, Uri};
use hyper_util::rt::TokioIo;

use crate::exit::{CliError, UNAVAILABLE, USAGE};

/// How long the push may take, connecting included.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// A Pushgateway's address: `http://HOST:PORT[/PREFIX]`.
#[derive(Clone, Debug)]
pub struct Pushgateway {
    authority: String,
    host: String,
    port: u16,
    /// The path before `/metrics/…`, without a trailing slash (empty for none).
    prefix: String,
    /// The URL as given, for messages.
    shown: String,
}

impl Pushgateway {
    /// Parses `--metrics-push URL`.
    ///
    /// # Errors
    /// Not an `http://HOST[:PORT][/PREFIX]` URL (exit 64).
    pub fn parse(url: &str) -> Result<Pushgateway, CliError> {
        let bad = |why: &str| {
            CliError::new(USAGE, format!("invalid --metrics-push {url:?}: {why}"))
                .hint("write the Pushgateway's base URL, like http://pushgateway:9091")
        };
        let uri: Uri = url.parse().map_err(|e| bad(&format!("{e}")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(bad(
                    "https is not supported: push to a Pushgateway on the host's network, \
                     or through a local TLS proxy",
                ))
            }
            _ => return Err(bad("it is not an http:// URL")),
        }
        let authority = uri.authority().ok_or_else(|| bad("it names no host"))?;
        if authority.as_str().contains('@') {
            return Err(bad("credentials in the URL are not supported"));
        }
        if uri.query().is_some() {
            return Err(bad("it has a query"));
        }
        Ok(Pushgateway {
            authority: authority.as_str().to_owned(),
            host: authority.host().trim_matches(['[', ']']).to_owned(),
            port: authority.port_u16().unwrap_or(80),
            prefix: uri.path().trim_end_matches('/').to_owned(),
            shown: url.to_owned(),
        })
    }

    /// The path of the group `job=JOB`: the name as it is when it is safe in a path,
    /// base64url-encoded (`job@base64/…`) otherwise, as the Pushgateway reads both.
    fn group_path(&self, job: &str) -> String {
        let plain = !job.is_empty()
            && job
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if plain {
            format!("{}/metrics/job/{job}", self.prefix)
        } else {
            format!(
                "{}/metrics/job@base64/{}",
                self.prefix,
                base64url(job.as_bytes())
            )
        }
    }

    /// Sends `exposition` (Prometheus text) as the group of `job`: PUT when `replace`, else
    /// POST (see the module's doc).
    ///
    /// # Errors
    /// The Pushgateway cannot be reached, does not answer within 10 s or refuses (exit 69).
    pub async fn push(&self, job: &str, exposition: String, replace: bool) -> Result<(), CliError> {
        let cannot = |why: String| {
            CliError::new(
                UNAVAILABLE,
                format!(
                    "cannot push the metrics to --metrics-push {}: {why}",
                    self.shown
                ),
            )
        };
        let method = if replace { Method::PUT } else { Method::POST };
        let request = Request::builder()
            .method(method)
            .uri(self.group_path(job))
            .header(header::HOST, &self.authority)
            .header(header::CONTENT_TYPE, "text/plain; version=0.0.4")
            .body(Full::new(Bytes::from(exposition)))
            .map_err(|e| cannot(e.to_string()))?;
        let exchange = async {
            let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(|e| e.to_string())?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status();
            if status.is_success() {
                return Ok(());
            }
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_owned())
                .unwrap_or_default();
            Err(format!("it answered {status}: {body}"))
        };
        match tokio::time::timeout(PUSH_TIMEOUT, exchange).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(cannot(why)),
            Err(_) => Err(cannot(format!("no answer within {PUSH_TIMEOUT:?}"))),
        }
    }
}

/// RFC 4648 base64 with the URL-safe alphabet and padding.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_follows_rfc_4648() {
        for (text, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
            ("jobs/a?>", "am9icy9hPz4="),
        ] {
            assert_eq!(base64url(text.as_bytes()), encoded, "{text}");
        }
    }

    #[test]
    fn groups_are_paths_under_the_prefix() {
        let gw = Pushgateway::parse("http://pg:9091/").unwrap();
        assert_eq!(gw.group_path("backup"), "/metrics/job/backup");
        assert_eq!(gw.group_path("jobs/a"), "/metrics/job@base64/am9icy9h");
        let gw = Pushgateway::parse("http://[::1]:9091/pushgateway").unwrap();
        assert_eq!((gw.host.as_str(), gw.port), ("::1", 9091));
        assert_eq!(gw.group_path("b"), "/pushgateway/metrics/job/b");
        for bad in [
            "https://pg:9091",
            "pg:9091",
            "http://u:p@pg:9091",
            "http://pg/?a=b",
        ] {
            assert!(Pushgateway::parse(bad).is_err(), "{bad}");
        }
    }
}
