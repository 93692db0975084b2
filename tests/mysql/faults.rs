//! Faults

use super::*;

/// The shared fault rules behind a fault proxy: restarted (the data survives, so do the
/// locks), killed, paused, blackholed ([`sql::fault_rules`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules() {
    sql::fault_rules::<Mysql>().await;
}

/// Fences strictly increase across a clean restart and a `kill -9`, and a lock held over
/// the crash is still held ([`sql::fences_strictly_increase_across_a_restart_and_a_kill`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_across_a_restart_and_a_kill() {
    sql::fences_strictly_increase_across_a_restart_and_a_kill::<Mysql>().await;
}
