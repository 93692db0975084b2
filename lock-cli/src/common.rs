//! What every subcommand shares: choosing and connecting the lock server, durations.

use std::time::Duration;

use distlock::Locker;

use crate::exit::{CliError, USAGE};

/// Where the lock-server URL came from, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `--url`.
    Flag,
    /// The `DISTLOCK_URL` environment variable.
    Env,
    /// Neither was given: `memory://`.
    Default,
}

impl Origin {
    fn describe(self) -> &'static str {
        match self {
            Origin::Flag => "from --url",
            Origin::Env => "from DISTLOCK_URL",
            Origin::Default => "the default, as neither --url nor DISTLOCK_URL is set",
        }
    }
}

/// A lock-server URL and where it came from.
#[derive(Clone, Debug)]
pub struct Target {
    url: String,
    origin: Origin,
}

impl Target {
    /// `--url` when given, else what [`distlock::from_env`] would use: `DISTLOCK_URL`, else
    /// `memory://`.
    ///
    /// # Errors
    /// `DISTLOCK_URL` is set but not UTF-8.
    pub fn choose(flag: Option<String>) -> Result<Target, CliError> {
        if let Some(url) = flag {
            return Ok(Target::flag(url));
        }
        match distlock::env_url() {
            Ok(Some(url)) => Ok(Target {
                url,
                origin: Origin::Env,
            }),
            Ok(None) => Ok(Target {
                url: distlock::DEFAULT_URL.to_owned(),
                origin: Origin::Default,
            }),
            Err(distlock::Error::InvalidUrl { reason, .. }) => Err(CliError::new(USAGE, reason)),
            Err(other) => Err(CliError::from_lock(other, "", Origin::Env.describe())),
        }
    }

    /// A URL given with `--url`.
    pub fn flag(url: String) -> Target {
        Target {
            url,
            origin: Origin::Flag,
        }
    }

    /// Whether neither `--url` nor `DISTLOCK_URL` named the server (it is `memory://`).
    pub fn is_default(&self) -> bool {
        self.origin == Origin::Default
    }

    /// The URL with any password replaced by `***`, safe to print.
    pub fn shown(&self) -> String {
        distlock::url::redact(&self.url)
    }

    /// Builds the Locker; a failure is reported with the URL and its origin.
    ///
    /// # Errors
    /// Bad URL, backend not compiled in, server unreachable or refusing.
    pub async fn connect(&self) -> Result<Locker, CliError> {
        distlock::connect(&self.url)
            .await
            .map_err(|e| self.error(e))
    }

    /// Maps a library error met while using this server.
    pub fn error(&self, err: distlock::Error) -> CliError {
        CliError::from_lock(err, &self.shown(), self.origin.describe())
    }
}

/// Writes `text` to stdout. A reader that went away (`distlock bench | head`) is not an
/// error worth a panic: the rest of the output is dropped.
pub fn print_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// Parses a human duration (`30s`, `500ms`, `5m`, `1h 30m`) for clap: the grammar of
/// duration parameters in lock URLs, so `--ttl 2min` and `?timeout=2min` mean the same.
pub use distlock::url::parse_duration;

/// Like [`parse_duration`], refusing zero.
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err("must be greater than zero".to_owned());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_human_form() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("30").unwrap_err().contains("like 30s"));
        assert!(parse_duration("abc").is_err());
        assert!(parse_positive_duration("0s").is_err());
    }
}
