//! Durations and latencies written for people.

use std::time::Duration;

/// Nanoseconds of a duration, saturating (for histograms).
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A duration for people: whole milliseconds at most (`1m 30s`, `250ms`, `0s`).
pub fn fmt_duration(d: Duration) -> String {
    let ms = Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    if ms.is_zero() && !d.is_zero() {
        return format!("{}µs", d.as_micros());
    }
    humantime::format_duration(ms).to_string()
}

/// A latency in nanoseconds with three significant digits in a fitting unit.
pub fn fmt_nanos(ns: u64) -> String {
    let v = ns as f64;
    let (value, unit) = if ns < 1_000 {
        return format!("{ns}ns");
    } else if ns < 1_000_000 {
        (v / 1e3, "µs")
    } else if ns < 1_000_000_000 {
        (v / 1e6, "ms")
    } else {
        (v / 1e9, "s")
    };
    if value >= 100.0 {
        format!("{value:.0}{unit}")
    } else if value >= 10.0 {
        format!("{value:.1}{unit}")
    } else {
        format!("{value:.2}{unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_for_people() {
        assert_eq!(fmt_duration(Duration::from_millis(90_250)), "1m 30s 250ms");
        assert_eq!(fmt_duration(Duration::from_micros(1_999)), "1ms");
        assert_eq!(fmt_duration(Duration::from_micros(20)), "20µs");
        assert_eq!(fmt_duration(Duration::ZERO), "0s");
        assert_eq!(fmt_nanos(999), "999ns");
        assert_eq!(fmt_nanos(1_234), "1.23µs");
        assert_eq!(fmt_nanos(12_345_000), "12.3ms");
        assert_eq!(fmt_nanos(2_500_000_000), "2.50s");
    }
}
