//! Group commit: requests that arrive while the way to the server is busy go together.
//!
//! A lock server pays a fixed cost per request (a raft round and a log sync on etcd; the
//! dispatch and script set-up on Redis) on top of the work per key. [`GroupCommit`] lets at
//! most `max_in_flight` calls be on their way at once; a request that arrives when there is
//! room goes alone at once (a lone caller waits for nothing), and requests that arrive
//! meanwhile queue and then go as one group, which the backend sends as one server call
//! ([`GroupSend::send_group`]). A group never holds two requests on the same key, so the
//! backend may write each key once per call.
//!
//! Requests on one key reach the server in the order they were sent: a request waits while
//! another on its key is on its way. So a release that cleans up after an abandoned acquire
//! (its caller gone, its request still queued or on its way) always runs after it.
//!
//! A call's slot and its keys' busy marks belong to a guard that is created when the call is
//! counted and moves into the task that sends it, so they are freed however the call ends:
//! answered, cancelled, or its task dropped before it ever ran (a runtime shutting down).

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

/// How a backend sends requests: alone, or as a group in one server call.
pub trait GroupSend: Send + Sync + 'static {
    /// One request (one key's operation).
    type Request: Send + 'static;
    /// Its answer.
    type Answer: Send + 'static;
    /// Its error.
    type Error: Send + 'static;

    /// Sends one request alone. `dispatched` may be called once the request is on a path
    /// where nothing sent after it can overtake it (e.g. queued on a connection the server
    /// reads in order): requests on its key may then follow before its answer. Without the
    /// call they wait for the answer.
    fn send_one(
        &self,
        request: Self::Request,
        dispatched: &(dyn Fn() + Sync),
    ) -> impl Future<Output = Result<Self::Answer, Self::Error>> + Send;

    /// Sends a group (two or more requests, on distinct keys) and returns one result per
    /// request, in order. Each request must get the answer it would have got alone.
    /// `dispatched` as for [`send_one`](Self::send_one), for the whole group.
    fn send_group(
        &self,
        requests: Vec<Self::Request>,
        dispatched: &(dyn Fn() + Sync),
    ) -> impl Future<Output = Vec<Result<Self::Answer, Self::Error>>> + Send;

    /// The error of a request whose group ended without an answer for it (the group's task
    /// was cancelled, or the backend answered fewer results than requests).
    fn no_answer(&self) -> Self::Error;

    /// Whether `other` may go in the same group as `first` (e.g. only requests of one kind,
    /// when each kind is a different server call). The default: any two.
    fn groups_with(&self, first: &Self::Request, other: &Self::Request) -> bool {
        let _ = (first, other);
        true
    }
}

type Reply<S> = oneshot::Sender<Result<<S as GroupSend>::Answer, <S as GroupSend>::Error>>;

/// A request's key as the group commit tracks it: a hash. Two keys with one hash are only
/// kept apart as if they were one key (never grouped together, never on their way
/// together), which costs time, not correctness.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupKey(u64);

impl GroupKey {
    /// The group key of `key`.
    pub fn of<K: Hash + ?Sized>(key: &K) -> Self {
        static SEED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
            std::sync::OnceLock::new();
        GroupKey(SEED.get_or_init(Default::default).hash_one(key))
    }
}

struct Pending<S: GroupSend> {
    key: GroupKey,
    request: S::Request,
    reply: Reply<S>,
}

struct State<S: GroupSend> {
    in_flight: usize,
    queue: VecDeque<Pending<S>>,
    /// Keys with a request on its way: later requests on them wait.
    busy: HashSet<GroupKey>,
}

/// Sends requests through a [`GroupSend`], grouping those that arrive while
/// `max_in_flight` calls are on their way (see the [module](self) documentation).
pub struct GroupCommit<S: GroupSend> {
    sender: S,
    max_in_flight: usize,
    max_group: usize,
    state: Mutex<State<S>>,
}

/// Calls on their way at once before requests queue for a group (the connection pipelines
/// them): the default of [`GroupCommit::new`].
pub const MAX_IN_FLIGHT: usize = 2;
/// Requests in one group: the default of [`GroupCommit::new`]. It keeps one call well
/// inside the servers' own limits (etcd refuses transactions of more than `--max-txn-ops`,
/// default 128, operations).
pub const MAX_GROUP: usize = 64;

impl<S: GroupSend> GroupCommit<S> {
    /// A group commit over `sender` with the default limits, [`MAX_IN_FLIGHT`] and
    /// [`MAX_GROUP`].
    pub fn new(sender: S) -> Arc<Self> {
        Self::with_limits(sender, MAX_IN_FLIGHT, MAX_GROUP)
    }

    /// A group commit over `sender` with at most `max_in_flight` calls on their way and at
    /// most `max_group` requests per group (both at least 1).
    pub fn with_limits(sender: S, max_in_flight: usize, max_group: usize) -> Arc<Self> {
        Arc::new(GroupCommit {
            sender,
            max_in_flight: max_in_flight.max(1),
            max_group: max_group.max(1),
            state: Mutex::new(State {
                in_flight: 0,
                queue: VecDeque::new(),
                busy: HashSet::new(),
            }),
        })
    }

    /// The sender.
    pub fn sender(&self) -> &S {
        &self.sender
    }

    fn state(&self) -> MutexGuard<'_, State<S>> {
        crate::sync::lock(&self.state)
    }

    /// Sends `request`, which acts on `key` only: alone at once when there is room, or in
    /// the next group. A call is bounded by the sender; a request that has to queue is
    /// answered within `patience` (the request itself may still go later).
    ///
    /// # Errors
    /// The sender's error for this request, or [`GroupSend::no_answer`] (also when the
    /// patience ran out in the queue).
    pub async fn send(
        self: &Arc<Self>,
        key: GroupKey,
        request: S::Request,
        patience: Duration,
    ) -> Result<S::Answer, S::Error> {
        let mut launches = Vec::new();
        let queued = {
            let mut state = self.state();
            if state.in_flight < self.max_in_flight
                && state.queue.is_empty()
                && !state.busy.contains(&key)
            {
                state.in_flight += 1;
                state.busy.insert(key);
                Err(request)
            } else {
                let (reply, answer) = oneshot::channel();
                state.queue.push_back(Pending {
                    key,
                    request,
                    reply,
                });
                launches = self.launch(&mut state);
                Ok(answer)
            }
        };
        spawn_groups(launches);
        match queued {
            Ok(answer) => match tokio::time::timeout(patience, answer).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) | Err(_) => Err(self.sender.no_answer()),
            },
            Err(request) => {
                // Created in the same poll as the slot was counted: nothing can drop the
                // future in between.
                let room = Room::new(self.clone(), Keys::One(key));
                self.sender.send_one(request, &|| room.free_keys()).await
            }
        }
    }

    /// Number of requests waiting for a group.
    pub fn queued(&self) -> usize {
        self.state().queue.len()
    }

    /// Takes queued requests as groups while there is room on the way, each with the room
    /// (its slot and its keys' busy marks) it will free. The caller spawns them with
    /// [`spawn_groups`] once the state lock is released: a runtime that is shutting down
    /// drops a spawned task at once, inside `spawn`, and that drop takes the lock again.
    ///
    /// The room is counted here and travels into the task, so a task dropped before its
    /// first poll (the runtime shutting down, or refusing it) still frees its slot and its
    /// keys when its future is dropped: nothing leaks.
    #[must_use = "the groups must be spawned"]
    fn launch(self: &Arc<Self>, state: &mut State<S>) -> Launches<S> {
        let mut launches = Vec::new();
        while state.in_flight < self.max_in_flight && !state.queue.is_empty() {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                // No runtime (shutting down): the callers get `no_answer` from their
                // dropped replies.
                state.queue.clear();
                break;
            };
            let group = take_group(state, self.max_group, |a, b| self.sender.groups_with(a, b));
            if group.is_empty() {
                // Everything queued waits for a key on its way.
                break;
            }
            state.in_flight += 1;
            let keys: Vec<GroupKey> = group.iter().map(|p| p.key).collect();
            state.busy.extend(keys.iter().copied());
            let room = Room::new(self.clone(), Keys::Many(keys));
            launches.push((runtime, group, room));
        }
        launches
    }

    async fn send_group(&self, group: Vec<Pending<S>>, dispatched: &(dyn Fn() + Sync)) {
        if group.len() == 1 {
            if let Some(Pending { request, reply, .. }) = group.into_iter().next() {
                let _ = reply.send(self.sender.send_one(request, dispatched).await);
            }
            return;
        }
        let (requests, replies): (Vec<_>, Vec<_>) =
            group.into_iter().map(|p| (p.request, p.reply)).unzip();
        let mut results = self
            .sender
            .send_group(requests, dispatched)
            .await
            .into_iter();
        for reply in replies {
            let result = results
                .next()
                .unwrap_or_else(|| Err(self.sender.no_answer()));
            let _ = reply.send(result);
        }
    }
}

/// Groups taken by [`GroupCommit::launch`], each with its runtime and its room.
type Launches<S> = Vec<(tokio::runtime::Handle, Vec<Pending<S>>, Room<S>)>;

/// Spawns the groups [`GroupCommit::launch`] took (call it without the state lock held).
/// Each task owns its room from the start, so dropping it unpolled frees the room.
///
/// A runtime that is shutting down drops a task inside `spawn`; its room's drop launches
/// the next groups, whose spawn drops them at once too, and so on: so spawns made during
/// a spawn are deferred to the outermost call's loop instead of recursing (one level of
/// stack however long the queue).
fn spawn_groups<S: GroupSend>(launches: Launches<S>) {
    if launches.is_empty() {
        return;
    }
    let spawn = move || {
        for (runtime, group, room) in launches {
            runtime.spawn(async move {
                let commit = room.commit.clone();
                commit.send_group(group, &|| room.free_keys()).await;
            });
        }
    };
    let nested = DEFERRED.with(|deferred| match deferred.borrow_mut().as_mut() {
        Some(later) => {
            later.push(Box::new(spawn));
            None
        }
        None => Some(spawn),
    });
    let Some(spawn) = nested else {
        return;
    };
    DEFERRED.with(|deferred| *deferred.borrow_mut() = Some(Vec::new()));
    spawn();
    while let Some(next) =
        DEFERRED.with(|deferred| deferred.borrow_mut().as_mut().and_then(Vec::pop))
    {
        next();
    }
    DEFERRED.with(|deferred| *deferred.borrow_mut() = None);
}

thread_local! {
    /// Spawns deferred by a [`spawn_groups`] running further up this thread's stack.
    #[allow(clippy::type_complexity)]
    static DEFERRED: std::cell::RefCell<Option<Vec<Box<dyn FnOnce()>>>> =
        const { std::cell::RefCell::new(None) };
}

/// A place on the way, and the keys it carries; freeing the keys (at dispatch, or at the
/// latest on leaving) lets the requests waiting on them go.
struct Room<S: GroupSend> {
    commit: Arc<GroupCommit<S>>,
    keys: Mutex<Keys>,
}

/// The keys of a call: a lone request's, without an allocation, or a group's.
#[derive(Default)]
enum Keys {
    #[default]
    None,
    One(GroupKey),
    Many(Vec<GroupKey>),
}

impl Keys {
    fn is_empty(&self) -> bool {
        matches!(self, Keys::None)
    }

    fn unmark(self, busy: &mut HashSet<GroupKey>) {
        match self {
            Keys::None => {}
            Keys::One(key) => {
                busy.remove(&key);
            }
            Keys::Many(keys) => {
                for key in &keys {
                    busy.remove(key);
                }
            }
        }
    }
}

impl<S: GroupSend> Room<S> {
    fn new(commit: Arc<GroupCommit<S>>, keys: Keys) -> Self {
        Room {
            commit,
            keys: Mutex::new(keys),
        }
    }

    fn take_keys(&self) -> Keys {
        std::mem::take(&mut *crate::sync::lock(&self.keys))
    }

    fn free_keys(&self) {
        let keys = self.take_keys();
        if keys.is_empty() {
            return;
        }
        let launches = {
            let mut state = self.commit.state();
            keys.unmark(&mut state.busy);
            self.commit.launch(&mut state)
        };
        spawn_groups(launches);
    }
}

impl<S: GroupSend> Drop for Room<S> {
    /// Frees the slot and whatever keys are still marked, then launches what can go.
    fn drop(&mut self) {
        let keys = self.take_keys();
        let launches = {
            let mut state = self.commit.state();
            state.in_flight -= 1;
            keys.unmark(&mut state.busy);
            self.commit.launch(&mut state)
        };
        spawn_groups(launches);
    }
}

/// Up to `max` queued requests, oldest first, on distinct keys none of which is on its way,
/// each allowed to go with the first (`joins`); the others keep their place and order.
fn take_group<S: GroupSend>(
    state: &mut State<S>,
    max: usize,
    joins: impl Fn(&S::Request, &S::Request) -> bool,
) -> Vec<Pending<S>> {
    // Keys seen in the queue so far: a later request on one of them must not overtake it.
    let mut seen = HashSet::new();
    let mut group: Vec<Pending<S>> = Vec::new();
    let mut later = VecDeque::new();
    while let Some(p) = state.queue.pop_front() {
        let first_on_key = seen.insert(p.key);
        let fits = group.len() < max
            && first_on_key
            && !state.busy.contains(&p.key)
            && group.first().is_none_or(|f| joins(&f.request, &p.request));
        if fits {
            group.push(p);
        } else {
            later.push_back(p);
        }
    }
    state.queue = later;
    group
}

pub mod leases;
#[cfg(test)]
mod tests;
