//! What every subcommand shares: choosing and connecting the lock server, durations.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::ArgMatches;
use distlock::Locker;

use crate::exit::CliError;

/// `--url URL` (or `DISTLOCK_URL`), as the subcommands that talk to one lock server take
/// it (`#[command(flatten)]`).
#[derive(clap::Args, Clone, Debug)]
pub struct UrlArg {
    /// Lock server URL (the forms are in `distlock --help`) [default: memory://].
    #[arg(
        short = 'u',
        long,
        value_name = "URL",
        env = "DISTLOCK_URL",
        hide_env_values = true
    )]
    pub url: Option<String>,
}

/// Where the lock-server URL came from, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `--url`.
    Flag,
    /// The `DISTLOCK_URL` environment variable.
    Env,
    /// Neither was given: `memory://`, or for `distlock run` a file lock in the per-user
    /// lock directory.
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

/// Whether the URL of the subcommand being run came from `DISTLOCK_URL` (see
/// [`note_url_source`]).
static URL_FROM_ENV: AtomicBool = AtomicBool::new(false);

/// Notes whether the `--url` of the subcommand in `matches` was read from `DISTLOCK_URL`
/// (clap's `env`) rather than given on the command line, for [`Target::choose`]'s messages.
pub fn note_url_source(matches: &ArgMatches) {
    let mut leaf = matches;
    while let Some((_, sub)) = leaf.subcommand() {
        leaf = sub;
    }
    let from_env = leaf.ids().any(|id| id.as_str() == "url")
        && leaf.value_source("url") == Some(ValueSource::EnvVariable);
    URL_FROM_ENV.store(from_env, Ordering::Relaxed);
}

impl Target {
    /// The URL of `--url` (clap reads `DISTLOCK_URL` when the flag is absent), else
    /// `memory://`.
    pub fn choose(url: Option<String>) -> Target {
        match url {
            Some(url) if URL_FROM_ENV.load(Ordering::Relaxed) => Target {
                url,
                origin: Origin::Env,
            },
            Some(url) => Target::flag(url),
            None => Target {
                url: distlock::DEFAULT_URL.to_owned(),
                origin: Origin::Default,
            },
        }
    }

    /// `distlock run`'s choice: the URL of `--url` (or `DISTLOCK_URL`), else a file lock in
    /// the per-user lock directory ([`distlock::file::user_dir`]): it excludes the
    /// processes of this user on this host, as `flock(1)` does, where `memory://` would
    /// exclude nothing between two `distlock` processes.
    ///
    /// # Errors
    /// The per-user directory cannot be made, or is not this user's alone.
    pub fn choose_on_this_host(url: Option<String>) -> Result<Target, CliError> {
        if url.is_some() {
            return Ok(Target::choose(url));
        }
        let origin = Origin::Default.describe();
        let url = distlock::file::user_dir()
            .and_then(|dir| distlock::file::FileBackend::url_of(&dir))
            .map_err(|e| CliError::from_lock(e, "file://", origin))?;
        Ok(Target {
            url,
            origin: Origin::Default,
        })
    }

    /// A URL given with `--url`.
    pub fn flag(url: String) -> Target {
        Target {
            url,
            origin: Origin::Flag,
        }
    }

    /// Whether neither `--url` nor `DISTLOCK_URL` named the server (it is `memory://`, or
    /// the per-user file lock of [`choose_on_this_host`](Self::choose_on_this_host)).
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

/// Writes `bytes` to stdout, as [`print_stdout`] writes text.
pub fn print_stdout_bytes(bytes: &[u8]) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(bytes).and_then(|()| out.flush());
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
