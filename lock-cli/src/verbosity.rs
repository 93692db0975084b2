//! How much distlock says on stderr: the global `-q` and `-v` flags and `RUST_LOG`.
//!
//! Two kinds of messages reach stderr: distlock's own (`distlock: …`: errors, warnings,
//! notes) and the libraries' `tracing` events (the etcd backend's warning about a server
//! that frees held locks early, a lost lock, a Redlock node down at start), printed by a
//! `tracing-subscriber` as `WARN lock_etcd::connect: …`. By default every error and
//! warning is shown; `-q` leaves errors only; `-v` adds the libraries' info events, `-vv`
//! their debug events, `-vvv` trace. `RUST_LOG`, when set, replaces the libraries' filter
//! that `-q` and `-v` choose (its syntax is `tracing-subscriber`'s `EnvFilter`:
//! `lock_redis=debug,info`); `-q` still silences distlock's own notes and warnings.

use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::EnvFilter;

use crate::exit::{CliError, USAGE};

/// The crates whose events distlock shows by default: the command itself (its crate is
/// named `distlock`, like the facade library) and the library crates.
const OURS: [&str; 10] = [
    "distlock",
    "lock_core",
    "lock_memory",
    "lock_redis",
    "lock_redlock",
    "lock_etcd",
    "lock_postgres",
    "lock_mysql",
    "lock_zookeeper",
    "lock_scheduler",
];

static QUIET: AtomicBool = AtomicBool::new(false);

/// What `-q` and `-v` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verbosity {
    /// `-q`: errors only.
    Quiet,
    /// Neither: errors and warnings.
    Normal,
    /// `-v` given this many times: also info (1), debug (2) or trace (3 and more) events of
    /// the libraries.
    Verbose(u8),
}

impl Verbosity {
    /// From the flags (the caller refuses `-q` with `-v`).
    pub fn from_flags(quiet: bool, verbose: u8) -> Verbosity {
        match (quiet, verbose) {
            (true, _) => Verbosity::Quiet,
            (false, 0) => Verbosity::Normal,
            (false, n) => Verbosity::Verbose(n),
        }
    }

    /// The `EnvFilter` directives of this verbosity: a level for distlock's crates, and one
    /// (lower) for every other crate (the clients of the servers, the HTTP stack).
    fn directives(self) -> String {
        let (ours, others) = match self {
            Verbosity::Quiet => ("error", "error"),
            Verbosity::Normal => ("warn", "error"),
            Verbosity::Verbose(1) => ("info", "warn"),
            Verbosity::Verbose(2) => ("debug", "warn"),
            Verbosity::Verbose(_) => ("trace", "info"),
        };
        let mut directives = others.to_owned();
        for name in OURS {
            directives.push_str(&format!(",{name}={ours}"));
        }
        directives
    }
}

/// Applies `verbosity` to distlock's own messages ([`quiet`]) and installs the process's
/// `tracing` subscriber: plain text on stderr, filtered by `RUST_LOG` when it is set, else
/// by the verbosity.
///
/// # Errors
/// `RUST_LOG` is not a valid filter (exit 64).
pub fn init(verbosity: Verbosity) -> Result<(), CliError> {
    QUIET.store(verbosity == Verbosity::Quiet, Ordering::Relaxed);
    let filter = match std::env::var(EnvFilter::DEFAULT_ENV) {
        Ok(text) if !text.trim().is_empty() => EnvFilter::builder()
            .parse(&text)
            .map_err(|e| CliError::new(USAGE, format!("invalid RUST_LOG {text:?}: {e}")))?,
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(CliError::new(USAGE, "RUST_LOG is not valid UTF-8"))
        }
        _ => EnvFilter::new(verbosity.directives()),
    };
    // Only fails when a subscriber is already installed, which nothing else does.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .try_init();
    Ok(())
}

/// Whether `-q` was given: distlock's notes and warnings are left out, and `run` prints
/// nothing when another holder keeps its command from running.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// `eprintln!` for distlock's own notes and warnings (not errors): left out under `-q`.
macro_rules! note {
    ($($arg:tt)*) => {
        if !$crate::verbosity::quiet() {
            eprintln!($($arg)*);
        }
    };
}
pub(crate) use note;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_raise_our_crates_above_the_others() {
        let normal = Verbosity::Normal.directives();
        assert!(normal.starts_with("error,"), "{normal}");
        assert!(normal.contains(",lock_etcd=warn"), "{normal}");
        assert!(normal.contains(",distlock=warn"), "{normal}");
        assert!(Verbosity::from_flags(false, 2)
            .directives()
            .contains(",lock_core=debug"));
        assert_eq!(Verbosity::from_flags(true, 0), Verbosity::Quiet);
        assert!(EnvFilter::builder()
            .parse(Verbosity::Verbose(3).directives())
            .is_ok());
    }
}
