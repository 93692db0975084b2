//! Leader mode: one elected replica fires every job; the others stand by and take over
//! within the leadership's TTL when it dies. Each run still claims its fire time, so a
//! fire time runs once even across a change of leader.

use std::time::{Duration, SystemTime};

use lock_core::LockOptions;

use crate::mode::LeaderMode;
use crate::state::{Control, Inner};

/// How long a replica waits after a failed campaign before the next.
const RETRY: Duration = Duration::from_secs(1);

/// Campaigns until the scheduler stops: while this replica leads, `inner.leading` holds
/// the term; on a lost leadership it campaigns again; at the stop it resigns, so a standby
/// takes over at once.
pub(crate) async fn lead(inner: std::sync::Arc<Inner>, control: Control, mode: LeaderMode) {
    let mut stop = control.state.stop.subscribe();
    let election = match inner.locker.election(&mode.election) {
        Ok(election) => election,
        // Checked at the start.
        Err(e) => return tracing::error!(error = %e.report(), "no election to lead"),
    };
    let opts = LockOptions::new().ttl(mode.ttl).wait_forever();
    loop {
        let campaign = tokio::select! {
            _ = stop.wait_for(|stopping| *stopping) => return,
            campaign = election.campaign(inner.replica.as_bytes(), &opts) => campaign,
        };
        let leadership = match campaign {
            Ok(leadership) => leadership,
            Err(e) => {
                tracing::warn!(election = mode.election, error = %e.report(), "campaign failed; trying again");
                tokio::select! {
                    _ = stop.wait_for(|stopping| *stopping) => return,
                    () = tokio::time::sleep(RETRY) => continue,
                }
            }
        };
        tracing::info!(election = mode.election, term = leadership.term(), replica = %inner.replica, "leading: this replica fires the jobs");
        inner.leading.send_replace(Some(leadership.term()));
        let stopped = tokio::select! {
            _ = stop.wait_for(|stopping| *stopping) => true,
            () = leadership.lost() => false,
        };
        inner.leading.send_replace(None);
        if stopped {
            let _ = leadership.resign().await;
            return;
        }
        tracing::warn!(
            election = mode.election,
            term = leadership.term(),
            "leadership lost: standing by"
        );
    }
}

/// Whether this replica may fire a fire time due at `at` (on the server's clock): always
/// outside leader mode; in leader mode once it leads, waiting for the leadership until
/// the fire time's lateness bound `until` passes (a standby taking over just after a fire
/// time still runs it). `false` when the scheduler stops meanwhile.
pub(crate) async fn may_fire(inner: &Inner, control: &Control, until: SystemTime) -> bool {
    if inner.leader.is_none() {
        return true;
    }
    let mut leading = inner.leading.subscribe();
    if leading.borrow().is_some() {
        return true;
    }
    let mut stop = control.state.stop.subscribe();
    let led = tokio::select! {
        _ = stop.wait_for(|stopping| *stopping) => return false,
        () = inner.clock.sleep_until(inner.ours(until)) => false,
        led = leading.wait_for(Option::is_some) => led.is_ok(),
    };
    led || inner.leading.borrow().is_some()
}
