//! How records and controls spell times and cut text: milliseconds since the Unix epoch,
//! and strings cut on a character boundary.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Keeps the last `max` bytes of `s`, starting on a character boundary.
pub(super) fn keep_tail(s: &mut String, max: usize) {
    if s.len() > max {
        let mut start = s.len() - max;
        while !s.is_char_boundary(start) {
            start += 1;
        }
        s.drain(..start);
    }
}

pub(super) fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

pub(super) fn millis(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

pub(super) fn from_millis(ms: i64) -> SystemTime {
    if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    }
}
