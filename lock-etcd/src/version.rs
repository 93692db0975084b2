//! The etcd server's version, read at connect, and what it tells about the server's own
//! lease safety.

/// A server version as etcd's `Status` reports it (`3.4.23`, `3.5.17`, `3.6.0-rc.1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerVersion {
    text: String,
    parsed: Option<(u64, u64, u64)>,
}

impl ServerVersion {
    /// The version etcd reported; `text` is kept as is for display.
    pub(crate) fn new(text: &str) -> ServerVersion {
        ServerVersion {
            text: text.to_owned(),
            parsed: parse(text),
        }
    }

    /// The version as the server reported it.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// Whether this server may revoke leases that are alive after its leader stalls (etcd
    /// issue 15247): a leader stuck (paused, a slow disk sync) for longer than a lease's
    /// TTL still believes it leads when it resumes, finds every lease it knew expired by
    /// its own clock, and its revocations reach the new leader, which applies them, although
    /// clients kept those leases alive on the new leader meanwhile. A lock on such a lease
    /// is then freed while its holder's TTL runs. Mitigated by etcd pull request 16822
    /// (3.5 line, December 2023) and its 3.4 backport 17465 (February 2024): 3.5.12 and
    /// 3.4.30 are the first releases after them. A version that cannot be read counts as
    /// affected.
    pub(crate) fn revokes_live_leases_after_a_leader_stall(&self) -> bool {
        match self.parsed {
            None => true,
            Some((major, minor, patch)) => match (major, minor) {
                (3, 4) => patch < 30,
                (3, 5) => patch < 12,
                (m, n) => (m, n) < (3, 4),
            },
        }
    }
}

/// `major.minor.patch`, ignoring a pre-release or build suffix on the patch number.
fn parse(text: &str) -> Option<(u64, u64, u64)> {
    let mut parts = text.trim().trim_start_matches('v').splitn(3, '.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next()?;
    let digits = patch.len() - patch.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let patch = patch[..digits].parse().ok()?;
    Some((major, minor, patch))
}

#[cfg(test)]
mod tests {
    use super::ServerVersion;

    fn affected(v: &str) -> bool {
        ServerVersion::new(v).revokes_live_leases_after_a_leader_stall()
    }

    #[test]
    fn releases_before_the_fix_are_affected() {
        for v in [
            "3.4.23", "3.4.29", "3.5.0", "3.5.11", "3.3.27", "v3.4.0", "2.3.8",
        ] {
            assert!(affected(v), "{v}");
        }
    }

    #[test]
    fn releases_with_the_fix_are_not() {
        for v in [
            "3.4.30",
            "3.4.37",
            "3.5.12",
            "3.5.17",
            "3.6.0",
            "3.6.0-rc.1",
            "4.0.0",
        ] {
            assert!(!affected(v), "{v}");
        }
    }

    #[test]
    fn an_unreadable_version_counts_as_affected() {
        for v in ["", "unknown", "3", "3.5", "3.5.x", "a.b.c"] {
            assert!(affected(v), "{v:?}");
        }
        assert_eq!(ServerVersion::new(" 3.5.17 ").text(), " 3.5.17 ");
    }
}
