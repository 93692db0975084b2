//! The watchdog's turn on a hold: one renewal under the hold's operation lock, and the
//! next turn's schedule.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::GuardShared;
use crate::locker::metrics::Series;
use crate::locker::watchdog::{renewal_period, Renewable, Ticket};
use crate::sync::lock;

impl Renewable for GuardShared {
    /// One turn of the watchdog: renews the lease with the TTL it has when the turn takes
    /// the operation lock, and schedules the next turn a [`renewal_period`] later (sooner
    /// after a transient failure). A renewal that has not answered when the validity
    /// passes loses the lock; an ended or lost hold is not renewed, nor one whose turn was
    /// superseded meanwhile (an `extend` rescheduled it).
    fn renew_due(self: Arc<Self>, turn: Ticket) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            if self.is_done() || self.is_gone() {
                return;
            }
            let valid_until = self.valid_until();
            let answered = tokio::time::timeout_at(valid_until.into(), async {
                let _op = self.ops.lock().await;
                if *lock(&self.renewal) != Some(turn) {
                    return;
                }
                let ttl = self.ttl();
                let period = renewal_period(ttl.get());
                // The next turn is scheduled under the operation lock, so no `extend` can
                // come between this renewal and its rescheduling.
                match self.renew_locked(ttl).await {
                    Ok(_) => {
                        tracing::debug!(key = self.key(), "lock renewed");
                        self.schedule(Instant::now() + period);
                    }
                    Err(_) if self.is_done() || self.is_gone() => {}
                    Err(e) => {
                        tracing::debug!(key = self.key(), error = %e.report(), "renewal failed; retrying");
                        let now = Instant::now();
                        let left = self.valid_until().saturating_duration_since(now);
                        self.schedule(
                            now + (period / 4).min(left / 2).max(Duration::from_millis(1)),
                        );
                    }
                }
            })
            .await;
            if answered.is_err() && !self.is_done() {
                self.metrics(Series::renewal_failed);
                self.mark_lost("validity passed while the server did not answer");
            }
        })
    }
}
