//! The one duration grammar of distlock: humantime's, for URL parameters and the CLI alike.

use std::time::Duration;

use humantime::DurationError;

/// What every refusal suggests.
const EXAMPLES: &str = "expected a number with a unit, like 30s, 500ms, 5m or 1h 30m";

/// Parses a duration in humantime's grammar: one or more spans of an unsigned number
/// (fractions allowed: `1.5s`) and a unit (`ns`, `us`, `ms`, `s`/`sec`, `m`/`min`,
/// `h`/`hr`, `d`, `w`, …), optionally separated by spaces: `250ms`, `2min`, `1h 30m`,
/// `1h30m`. A bare `0` is zero; any other number needs a unit.
///
/// This is the grammar of duration parameters in URLs ([`LockUrl::duration_param`]) and
/// of the `distlock` command's `--ttl`, `--wait` and `--timeout`.
///
/// # Errors
/// A message saying why, quoting the input and giving examples: no unit, an unknown unit,
/// a sign or other stray character, or a value too large for [`Duration`] or finer than a
/// nanosecond.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_core::url::parse_duration;
///
/// assert_eq!(parse_duration("2min"), Ok(Duration::from_secs(120)));
/// assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
/// assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
/// assert!(parse_duration("5").unwrap_err().contains("no unit"));
/// ```
///
/// [`LockUrl::duration_param`]: super::LockUrl::duration_param
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    humantime::parse_duration(s).map_err(|err| {
        let why = match err {
            DurationError::Empty => return format!("empty duration ({EXAMPLES})"),
            DurationError::UnknownUnit { unit, .. } if unit.is_empty() => "has no unit".into(),
            DurationError::UnknownUnit { unit, .. } => {
                format!("has unknown unit `{unit}` (units: ns, us, ms, s, m, h, d, w)")
            }
            DurationError::NumberExpected(at) => format!("needs a number at byte {at}"),
            DurationError::InvalidCharacter(at) => format!("has a stray character at byte {at}"),
            DurationError::NumberOverflow => "is too large or finer than a nanosecond".into(),
        };
        format!("duration `{s}` {why} ({EXAMPLES})")
    })
}

/// Writes a duration so that [`parse_duration`] reads it back exactly, in one unit where it
/// can (`2s`, `250ms`, `1.5ms`): the inverse used when a configuration is turned back into
/// a URL.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos.is_multiple_of(1_000_000_000) {
        format!("{}s", d.as_secs())
    } else if u64::try_from(nanos).is_err() {
        // Past about 584 years the grammar cannot count milliseconds in nanoseconds;
        // fractional seconds carry any value.
        let frac = format!("{:09}", d.subsec_nanos());
        format!("{}.{}s", d.as_secs(), frac.trim_end_matches('0'))
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}ms", nanos / 1_000_000)
    } else {
        let frac = format!("{:06}", nanos % 1_000_000);
        format!("{}.{}ms", nanos / 1_000_000, frac.trim_end_matches('0'))
    }
}
