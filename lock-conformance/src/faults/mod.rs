//! Fault rules: what a lock does when its servers restart, die, freeze or drop off the
//! network. The faults themselves come from the test kit, as hooks in a [`Faults`] given to
//! [`Target::with_faults`]; a rule whose hook or capability is missing does not run and says
//! so on stderr and in its [`Applied`] answer, never passing silently. [`run_faults`] runs
//! them all and returns a [`FaultReport`] of the rules that did not run.

mod common;
pub(crate) mod hooks;
mod outage;
mod restart;

pub use hooks::{Applied, BoxFuture, FaultHook, FaultReport, Faults};
pub use outage::*;
pub use restart::*;

use std::time::Duration;

use crate::target::Target;

/// Runs every fault rule on the target, in order, each bounded by a generous timeout so a
/// hang fails loudly with the rule's name; returns the rules that did not run.
pub async fn run_faults(t: &Target) -> FaultReport {
    let mut report = FaultReport::default();
    macro_rules! run {
        ($($rule:ident),* $(,)?) => {$(
            eprintln!("conformance [{}]: {}", t.caps().name, stringify!($rule));
            match tokio::time::timeout(Duration::from_secs(120), $rule(t)).await {
                Err(_) => panic!("conformance rule {} hung for 120 s", stringify!($rule)),
                Ok(Applied::Ran) => {}
                Ok(Applied::NotRun(why)) => report.not_run.push((stringify!($rule), why)),
            }
        )*};
    }
    run!(
        a_restart_that_loses_the_locks_leaves_holders_not_held,
        waiters_wake_after_a_restart_that_loses_the_locks,
        a_lock_survives_a_restart_that_keeps_the_locks,
        fences_increase_across_restarts,
        dead_servers_lose_the_holder_and_fail_every_call_fast,
        a_paused_server_bounds_every_call_and_loses_only_the_expired_holder,
        a_blackholed_network_bounds_every_call_and_loses_the_holder,
    );
    report
}
