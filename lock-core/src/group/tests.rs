//! Unit tests of the group commit.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

const PATIENCE: Duration = Duration::from_secs(5);

fn kind(request: &str) -> &str {
    request.split_once('/').map_or("", |(kind, _)| kind)
}

/// Echoes requests after a pause, counting calls and recording group sizes.
#[derive(Default)]
struct Echo {
    calls: AtomicUsize,
    groups: Mutex<Vec<Vec<String>>>,
    /// "start x" / "end x" for every request x, in order.
    log: Mutex<Vec<String>>,
}

impl Echo {
    fn note(&self, what: &str, requests: &[String]) {
        let mut log = self.log.lock().unwrap();
        log.extend(requests.iter().map(|r| format!("{what} {r}")));
    }

    fn position(&self, entry: &str) -> usize {
        let log = self.log.lock().unwrap();
        log.iter()
            .position(|e| e == entry)
            .unwrap_or_else(|| panic!("{entry} not in {log:?}"))
    }
}

impl GroupSend for Echo {
    type Request = String;
    type Answer = String;
    type Error = String;
    async fn send_one(
        &self,
        request: String,
        dispatched: &(dyn Fn() + Sync),
    ) -> Result<String, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.note("start", std::slice::from_ref(&request));
        if kind(&request) == "early" {
            dispatched();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.note("end", std::slice::from_ref(&request));
        Ok(request)
    }
    async fn send_group(
        &self,
        requests: Vec<String>,
        _dispatched: &(dyn Fn() + Sync),
    ) -> Vec<Result<String, String>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.groups.lock().unwrap().push(requests.clone());
        self.note("start", &requests);
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.note("end", &requests);
        requests
            .into_iter()
            .map(|r| if r == "bad" { Err(r) } else { Ok(r) })
            .collect()
    }
    fn no_answer(&self) -> String {
        "no answer".into()
    }
    /// Requests group with those of the same kind: the part before '/', if any.
    fn groups_with(&self, first: &String, other: &String) -> bool {
        kind(first) == kind(other)
    }
}

#[tokio::test]
async fn a_lone_request_goes_at_once_and_concurrent_ones_are_grouped() {
    let g = GroupCommit::with_limits(Echo::default(), 1, 8);
    assert_eq!(
        g.send(GroupKey::of("k"), "alone".into(), PATIENCE).await,
        Ok("alone".into())
    );
    assert_eq!(g.sender().calls.load(Ordering::SeqCst), 1);

    let keys: Vec<String> = (0..20)
        .map(|i| format!("k{i}"))
        .chain(["bad".into()])
        .collect();
    let answers = futures::future::join_all(
        keys.iter()
            .map(|k| g.send(GroupKey::of(k.as_str()), k.clone(), PATIENCE))
            .collect::<Vec<_>>(),
    )
    .await;
    for (k, a) in keys.iter().zip(answers) {
        if k == "bad" {
            assert_eq!(a, Err("bad".into()), "each request gets its own error");
        } else {
            assert_eq!(a.as_ref(), Ok(k), "each request gets its own answer");
        }
    }
    let calls = g.sender().calls.load(Ordering::SeqCst) - 1;
    assert!(
        calls < 6,
        "21 concurrent requests took {calls} calls: not grouped"
    );
    assert!(g
        .sender()
        .groups
        .lock()
        .unwrap()
        .iter()
        .all(|grp| grp.len() <= 8));
    assert_eq!(g.queued(), 0);
}

#[tokio::test]
async fn a_group_holds_each_key_once() {
    let g = GroupCommit::with_limits(Echo::default(), 1, 64);
    let requests = ["a", "b", "a", "c", "a"];
    let first = g.send(GroupKey::of("x"), "x".into(), PATIENCE);
    let rest: Vec<_> = requests
        .iter()
        .map(|k| g.send(GroupKey::of(*k), (*k).into(), PATIENCE))
        .collect();
    let (_, answers) = tokio::join!(first, futures::future::join_all(rest));
    assert!(answers.iter().all(Result::is_ok));
    for group in g.sender().groups.lock().unwrap().iter() {
        let distinct: HashSet<&String> = group.iter().collect();
        assert_eq!(distinct.len(), group.len(), "a key twice in {group:?}");
    }
}

/// A request waits while another on its key is on its way, even with room to spare, so
/// requests on one key run in the order they were sent; groups hold one kind only.
#[tokio::test]
async fn requests_on_one_key_keep_their_order_and_groups_their_kind() {
    let g = GroupCommit::with_limits(Echo::default(), 4, 64);
    // Requests are "kind/key"; the commit key is the part after '/'.
    let sends = ["acq/k", "rel/k", "acq/a", "rel/b", "acq/c"].map(|r| {
        g.send(
            GroupKey::of(r.split('/').nth(1).unwrap()),
            r.to_owned(),
            PATIENCE,
        )
    });
    let answers = futures::future::join_all(sends).await;
    assert!(answers.iter().all(Result::is_ok));
    let echo = g.sender();
    assert!(
        echo.position("end acq/k") < echo.position("start rel/k"),
        "rel/k overtook acq/k: {:?}",
        echo.log.lock().unwrap()
    );
    for group in echo.groups.lock().unwrap().iter() {
        let kinds: HashSet<&str> = group.iter().map(|r| kind(r)).collect();
        assert_eq!(kinds.len(), 1, "mixed kinds in {group:?}");
    }
}

/// A request the sender reports dispatched frees its key at once: the next request on
/// the key starts before the first is answered.
#[tokio::test]
async fn a_dispatched_request_lets_the_next_on_its_key_go() {
    let g = GroupCommit::with_limits(Echo::default(), 4, 64);
    let first = g.send(GroupKey::of("k"), "early/1".to_owned(), PATIENCE);
    let second = async {
        tokio::task::yield_now().await;
        g.send(GroupKey::of("k"), "early/2".to_owned(), PATIENCE)
            .await
    };
    let (a, b) = tokio::join!(first, second);
    assert!(a.is_ok() && b.is_ok());
    let echo = g.sender();
    assert!(
        echo.position("start early/2") < echo.position("end early/1"),
        "{:?}",
        echo.log.lock().unwrap()
    );
}

/// Answers at once, except "slow", which waits until `open` is notified.
#[derive(Default)]
struct Gated {
    open: tokio::sync::Notify,
}

impl GroupSend for Gated {
    type Request = String;
    type Answer = String;
    type Error = String;
    async fn send_one(
        &self,
        request: String,
        _dispatched: &(dyn Fn() + Sync),
    ) -> Result<String, String> {
        if request == "slow" {
            self.open.notified().await;
        }
        Ok(request)
    }
    async fn send_group(
        &self,
        requests: Vec<String>,
        _dispatched: &(dyn Fn() + Sync),
    ) -> Vec<Result<String, String>> {
        requests.into_iter().map(Ok).collect()
    }
    fn no_answer(&self) -> String {
        "no answer".into()
    }
}

/// A group's task that is dropped before its first poll (here: its runtime ends right
/// after spawning it) still frees its slot and its keys' busy marks, so the commit keeps
/// working on another runtime instead of queueing every request forever.
#[test]
fn a_group_task_dropped_unpolled_frees_its_slot_and_keys() {
    let g = GroupCommit::with_limits(Gated::default(), 1, 8);
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    };
    runtime().block_on(async {
        let slow = g.send(GroupKey::of("slow"), "slow".into(), PATIENCE);
        let queue_then_open = async {
            let queued = g.clone();
            // Queued behind "slow" (one call on the way at most).
            tokio::spawn(async move {
                let _ = queued
                    .send(GroupKey::of("next"), "next".into(), PATIENCE)
                    .await;
            });
            while g.queued() == 0 {
                tokio::task::yield_now().await;
            }
            g.sender().open.notify_one();
        };
        let (answer, ()) = tokio::join!(slow, queue_then_open);
        assert_eq!(answer, Ok("slow".into()));
        // Leaving "slow" spawned the group of "next", and this future returns before
        // the runtime polls it: dropping the runtime drops that task unpolled.
    });
    {
        let state = g.state();
        assert_eq!(state.in_flight, 0, "a dropped group task leaked its slot");
        assert!(
            state.busy.is_empty(),
            "a dropped group task leaked its keys"
        );
    }
    let answer = runtime().block_on(g.send(
        GroupKey::of("next"),
        "again".into(),
        Duration::from_millis(500),
    ));
    assert_eq!(answer, Ok("again".into()));
}
