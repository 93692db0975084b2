//! A job's control ([`JobControl`]): the pause and the latest trigger operators set for
//! every replica at once, kept in the lock server beside the job's records.

use std::time::SystemTime;

use super::codec::{from_millis, millis};
use crate::error::{Error, Result};

/// What operators set for a job across every replica at once, kept in the lock server
/// beside its records: a pause, and the latest trigger.
///
/// Written by `distlock cron pause / resume / trigger` (or [`RunRecords::set_control`](super::RunRecords::set_control));
/// every replica reads it before each fire time and polls it for triggers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobControl {
    /// While true, no replica starts a run of the job (fire times pass unrecorded; a
    /// trigger still runs).
    pub paused: bool,
    /// The newest trigger: a run is asked for at this instant, run once on one replica
    /// (each trigger instant is claimed like a fire time).
    pub trigger: Option<SystemTime>,
    /// Who changed the control last (`user@host`, or what the caller says).
    pub changed_by: String,
    /// When the control was changed last, on the changer's clock.
    pub changed_at: SystemTime,
}

impl JobControl {
    /// A control that pauses nothing and triggers nothing, changed by `by` at `at`.
    pub fn new(changed_by: impl Into<String>, changed_at: SystemTime) -> Self {
        JobControl {
            paused: false,
            trigger: None,
            changed_by: changed_by.into(),
            changed_at,
        }
    }

    /// Sets [`paused`](Self::paused).
    #[must_use]
    pub fn paused(mut self, paused: bool) -> Self {
        self.paused = paused;
        self
    }

    /// Sets [`trigger`](Self::trigger).
    #[must_use]
    pub fn trigger(mut self, trigger: Option<SystemTime>) -> Self {
        self.trigger = trigger;
        self
    }

    /// The control as the bytes a backend stores (one line of JSON).
    pub fn encode(&self) -> Vec<u8> {
        let value = serde_json::json!({
            "v": 1,
            "paused": self.paused,
            "trigger": self.trigger.map(millis),
            "changed_by": self.changed_by,
            "changed_at": millis(self.changed_at),
        });
        serde_json::to_vec(&value).expect("a JSON value always serializes")
    }

    /// Reads a control [`encode`](Self::encode) made, stored by the backend `backend`.
    ///
    /// # Errors
    /// [`Error::Backend`] when the bytes are not such a control.
    pub fn decode(backend: &'static str, bytes: &[u8]) -> Result<Self> {
        let bad = |why: &str| Error::backend(backend, format!("unreadable job control: {why}"));
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| bad(&e.to_string()))?;
        Ok(JobControl {
            paused: value["paused"].as_bool().ok_or_else(|| bad("no paused"))?,
            trigger: value["trigger"].as_i64().map(from_millis),
            changed_by: value["changed_by"].as_str().unwrap_or_default().to_owned(),
            changed_at: from_millis(
                value["changed_at"]
                    .as_i64()
                    .ok_or_else(|| bad("no changed_at"))?,
            ),
        })
    }
}
