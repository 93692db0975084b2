#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// docs.rs marks each item with the Cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

//! The conformance suite: the rules every backend keeps, one public async function each.
//!
//! Each function panics (like an assertion) when its rule is broken. Call them all with
//! [`run_all`], or one by one. A [`Target`] gives the suite the backend and, per backend,
//! the way to take a lock away behind its holder's back (by default
//! [`Admin::force_release`](lock_core::Admin::force_release)). Expectations follow the backend's [`Capabilities`](lock_core::Capabilities), never
//! its name; TTLs are scaled up to the backend's minimum.
//!
//! Several [`Locker`](lock_core::Locker)s over one backend stand in for several processes.
//!
//! The fault rules ([`run_faults`]) take hooks from the test kit ([`Faults`], given with
//! [`Target::with_faults`]) to restart, kill, pause or cut off the servers; a rule whose hook
//! or capability is missing reports itself not run, loudly.
//!
//! [`exclusion`] holds the randomized exclusion checker (many Lockers × tasks, faults
//! between rounds, a fenced resource that fails the run on any overlap).

/// Runs each rule on the target, in order, each bounded by a generous timeout so a hang
/// fails loudly with the rule's name.
macro_rules! run_rules {
    ($t:expr; $($rule:ident),* $(,)?) => {$(
        eprintln!("conformance [{}]: {}", $t.caps().name, stringify!($rule));
        if tokio::time::timeout(Duration::from_secs(120), $rule($t)).await.is_err() {
            panic!("conformance rule {} hung for 120 s", stringify!($rule));
        }
    )*};
}

mod basic;
mod claims;
mod election;
pub mod exclusion;
mod faults;
mod jobs;
mod permits;
mod records;
mod runtimes;
mod safety;
mod target;
mod waiting;

pub use basic::*;
pub use claims::*;
pub use election::*;
pub use faults::*;
pub use jobs::*;
pub use permits::*;
pub use records::*;
pub use runtimes::*;
pub use safety::*;
pub use target::{queued_holder, queued_holder_and_waiter, spawn_acquire, Target};
pub use waiting::*;

use std::time::Duration;

/// Runs every rule, in order, each bounded by a generous timeout so a hang fails loudly
/// with the rule's name.
pub async fn run_all(t: &Target) {
    run_rules!(
        t;
        grant_and_release,
        held_key_is_refused,
        different_keys_are_independent,
        stale_release_never_removes_new_holder,
        extend_of_expired_or_foreign_lease_fails,
        fencing_tokens_strictly_increase,
        fences_increase_within_a_millisecond,
        lock_expires_after_ttl,
        watchdog_keeps_lock_across_ttls,
        extend_then_watchdog_keeps_the_extended_ttl,
        lost_fires_when_taken_away,
        wait_timeout_is_bounded,
        waiter_is_handed_the_lock_promptly,
        a_queued_waiter_takes_over_from_its_sibling,
        cancelled_acquires_leave_nothing_behind,
        a_dropped_guards_key_is_taken_again_without_a_refusal,
        run_reports_outcomes_and_cancels_the_job,
        run_keeps_the_lock_for_its_at_least_hold,
        acquire_many_never_deadlocks,
        tasks_never_overlap,
        shutdown_releases_every_held_lock,
        a_locker_works_across_runtimes,
        a_dropped_runtime_leaves_nothing_waiting,
        invalid_input_is_refused,
        run_records_keep_the_newest,
        run_records_replace_their_slot,
        fire_time_claims_are_won_once,
        run_scheduled_runs_a_fire_time_once,
        claims_of_permits_follow_the_capabilities,
        permits_are_never_held_beyond_their_number,
        readers_share_and_a_writer_holds_alone,
        fences_increase_across_every_grant_of_a_key,
        permits_come_back_after_a_holders_ttl,
        a_permit_waiter_wakes_on_release,
        a_permit_waiter_behind_its_siblings_spends_no_refused_attempt,
        reader_writer_waiters_are_served_in_order,
        one_leader_per_term,
        proclaim_keeps_the_term,
        resign_hands_over_without_waiting_for_the_ttl,
        a_follower_observes_every_change_in_order,
        a_paused_leader_is_superseded_and_its_term_refused,
    );
}
