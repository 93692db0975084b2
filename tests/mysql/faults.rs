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

/// The lock connections closed by the server right after their last use (a restart within
/// a tenth of a second, `KILL CONNECTION`, a proxy closing them): the next acquisition,
/// one attempt with no waiting, is granted all the same, on a new connection. The
/// backend reuses a connection used that recently without a ping, finds it closed when
/// the script is sent, and sends the acquisition again (its script is re-entrant for its
/// owner). Before, it failed with `Unavailable` ("connection closed"), found by the fault
/// rules' quick restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_on_connections_closed_since_their_last_use_is_granted() {
    use mysql_async::prelude::Queryable;
    let server = MariaDbServer::start().await;
    let locker = Locker::new(backend(&mysql_url(server.addr(), "table=closed&timeout=2s")).await);
    let mut admin = server.client().await;
    let skip = LockOptions::new().ttl(Duration::from_secs(10)).skip();
    for round in 0..5 {
        let k = format!("closed-{round}-{}", rand_u32());
        // Three holders at once, so that every lock connection is open and idle after.
        let keys: Vec<String> = (0..3).map(|i| format!("{k}-{i}")).collect();
        let guards =
            futures::future::join_all(keys.iter().map(|key| locker.acquire(key, &skip))).await;
        for guard in guards {
            guard.unwrap().release().await.unwrap();
        }
        let ids: Vec<u64> = admin
            .query(
                "SELECT ID FROM information_schema.PROCESSLIST \
                 WHERE ID <> CONNECTION_ID() AND COMMAND = 'Sleep'",
            )
            .await
            .unwrap();
        assert!(
            !ids.is_empty(),
            "round {round}: the lock connections are open"
        );
        for id in ids {
            let _ = admin.query_drop(format!("KILL CONNECTION {id}")).await;
        }
        // The server closes the sockets; well within the time a connection is trusted.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let guard = locker
            .acquire(&k, &skip)
            .await
            .unwrap_or_else(|e| panic!("round {round}: {}", e.report()));
        guard.release().await.unwrap();
    }
}
