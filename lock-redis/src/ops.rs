//! Grouped operations: a node's acquires and releases go through one group commit
//! ([`lock_core::group`]), each group one call of the acquire or the release script.

use std::sync::{Arc, Weak};
use std::time::Duration;

use lock_core::group::GroupSend;
use redis::Value;

use crate::cluster;
use crate::codec::text;
use crate::connection::Connector;
use crate::error::{is_readonly, Failure};
use crate::scripts;

/// A callback run once a release request is queued on the connection.
pub(crate) type Queued = Arc<dyn Fn() + Send + Sync>;

/// One acquire of a group (its lock key travels with it).
pub(crate) struct AcquireOp {
    pub(crate) fence_key: String,
    pub(crate) tombstone: String,
    /// The holders of the key's permits: a lock is refused while they exist.
    pub(crate) holders: String,
    pub(crate) owner: [u8; 32],
    pub(crate) ttl_ms: u64,
    pub(crate) retention: u64,
    pub(crate) timeout: Duration,
}

/// One hand-over of a group (its lock key travels with it).
pub(crate) struct HandOverOp {
    pub(crate) fence_key: String,
    /// The next owner's tombstone: an abandoned attempt is not handed the lock.
    pub(crate) tombstone: String,
    pub(crate) from: [u8; 32],
    pub(crate) to: [u8; 32],
    pub(crate) ttl_ms: u64,
    pub(crate) retention: u64,
    pub(crate) timeout: Duration,
}

/// One release of a group (its lock key travels with it).
pub(crate) struct ReleaseOp {
    pub(crate) owner: [u8; 32],
    pub(crate) notice: String,
    pub(crate) queued: Option<Queued>,
    pub(crate) timeout: Duration,
}

/// A group's deadline: the longest of its members' timeouts from now (each caller also
/// bounds its own wait by its own timeout).
fn group_deadline(timeouts: impl Iterator<Item = Duration>) -> tokio::time::Instant {
    tokio::time::Instant::now() + timeouts.max().unwrap_or(Duration::from_secs(1))
}

/// One grouped operation of a node.
pub(crate) enum Op {
    Acquire(AcquireOp),
    HandOver(HandOverOp),
    Release(ReleaseOp),
}

/// Its answer: `(1, fence)`, `(0, pttl)` or `(-2, 0)` (held with permits) for an acquire
/// or a hand-over; 1 or 0 for a release; or the
/// server's refusal of an operation on this request's keys alone (e.g. `WRONGTYPE`), which
/// is this caller's error and nobody else's in its group.
pub(crate) enum Out {
    Acquire(i64, i64),
    Release(i64),
    Refused(String),
}

/// A node's acquires, hand-overs and releases, each group one call of [`scripts::ACQUIRE`],
/// [`scripts::HAND_OVER`] or [`scripts::RELEASE`] over one or more locks. One group commit carries both, so
/// operations on one lock reach the server in the order they were sent (a clean-up release
/// never overtakes the abandoned acquire it cleans up after).
pub(crate) struct Ops {
    link: Weak<Connector>,
    /// The release channel, an argument of the release script.
    channel: String,
    /// On a Redis Cluster a script may only touch keys of one slot: groups are per slot.
    cluster: bool,
}

impl Ops {
    /// The grouped operations over `link` (the node's connection, owned by the node: a
    /// request that finds it gone ends with [`gone`]).
    pub(crate) fn new(link: Weak<Connector>, channel: String, cluster: bool) -> Ops {
        Ops {
            link,
            channel,
            cluster,
        }
    }

    /// Runs `ops` (all acquires, all hand-overs or all releases) as one script call; `dispatched` is called
    /// once the call is queued on the connection, which the server reads in order.
    async fn run(
        &self,
        ops: &[(String, Op)],
        dispatched: &(dyn Fn() + Sync),
    ) -> std::result::Result<Vec<Out>, Failure> {
        let link = self.link.upgrade().ok_or_else(gone)?;
        let deadline = group_deadline(ops.iter().map(|(_, op)| match op {
            Op::Acquire(a) => a.timeout,
            Op::HandOver(h) => h.timeout,
            Op::Release(r) => r.timeout,
        }));
        let acquires = of_kind(ops, |op| match op {
            Op::Acquire(a) => Some(a),
            _ => None,
        });
        let releases = of_kind(ops, |op| match op {
            Op::Release(r) => Some(r),
            _ => None,
        });
        let hand_overs = of_kind(ops, |op| match op {
            Op::HandOver(h) => Some(h),
            _ => None,
        });
        if hand_overs.len() == ops.len() {
            let reply = link
                .eval(&scripts::HAND_OVER, deadline, dispatched, |cmd| {
                    cmd.arg(hand_overs.len() * 3);
                    for (lock_key, op) in &hand_overs {
                        cmd.arg(*lock_key).arg(&op.fence_key).arg(&op.tombstone);
                    }
                    for (_, op) in &hand_overs {
                        cmd.arg(&op.from[..])
                            .arg(&op.to[..])
                            .arg(op.ttl_ms)
                            .arg(op.retention);
                    }
                })
                .await?;
            return forget_if_replica(&link, acquire_answers(&reply, hand_overs.len()));
        }
        if acquires.len() == ops.len() {
            let reply = link
                .eval(&scripts::ACQUIRE, deadline, dispatched, |cmd| {
                    cmd.arg(acquires.len() * 4);
                    for (lock_key, op) in &acquires {
                        cmd.arg(*lock_key)
                            .arg(&op.fence_key)
                            .arg(&op.tombstone)
                            .arg(&op.holders);
                    }
                    for (_, op) in &acquires {
                        cmd.arg(&op.owner[..]).arg(op.ttl_ms).arg(op.retention);
                    }
                })
                .await?;
            return forget_if_replica(&link, acquire_answers(&reply, acquires.len()));
        }
        if releases.len() != ops.len() {
            return Err(Failure::Reply(
                "a group mixed acquires, hand-overs and releases".into(),
            ));
        }
        let queued = || {
            dispatched();
            for (_, op) in &releases {
                if let Some(queued) = &op.queued {
                    queued();
                }
            }
        };
        let reply = link
            .eval(&scripts::RELEASE, deadline, &queued, |cmd| {
                cmd.arg(releases.len());
                for (lock_key, _) in &releases {
                    cmd.arg(*lock_key);
                }
                cmd.arg(&self.channel);
                for (_, op) in &releases {
                    cmd.arg(&op.owner[..]).arg(&op.notice);
                }
            })
            .await?;
        forget_if_replica(&link, release_answers(&reply, releases.len()))
    }
}

impl GroupSend for Ops {
    type Request = (String, Op);
    type Answer = Out;
    type Error = Arc<Failure>;

    async fn send_one(
        &self,
        op: Self::Request,
        dispatched: &(dyn Fn() + Sync),
    ) -> std::result::Result<Out, Arc<Failure>> {
        let mut answers = self
            .run(std::slice::from_ref(&op), dispatched)
            .await
            .map_err(Arc::new)?;
        answers
            .pop()
            .ok_or_else(|| Arc::new(Failure::Reply("an empty reply".into())))
    }

    async fn send_group(
        &self,
        ops: Vec<Self::Request>,
        dispatched: &(dyn Fn() + Sync),
    ) -> Vec<std::result::Result<Out, Arc<Failure>>> {
        match self.run(&ops, dispatched).await {
            Ok(answers) => answers.into_iter().map(Ok).collect(),
            Err(failure) => {
                let failure = Arc::new(failure);
                ops.iter().map(|_| Err(failure.clone())).collect()
            }
        }
    }

    /// No answer in time (queued too long behind other calls), or its group was cut off.
    fn no_answer(&self) -> Arc<Failure> {
        Arc::new(Failure::Timeout)
    }

    /// A group is one script call: acquires, hand-overs or releases, one kind; on a
    /// cluster, of one hash slot (a lock's keys share its slot, so the lock keys decide).
    fn groups_with(&self, first: &Self::Request, other: &Self::Request) -> bool {
        matches!(
            (&first.1, &other.1),
            (Op::Acquire(_), Op::Acquire(_))
                | (Op::HandOver(_), Op::HandOver(_))
                | (Op::Release(_), Op::Release(_))
        ) && (!self.cluster || cluster::slot_of(&first.0) == cluster::slot_of(&other.0))
    }
}

/// The operations of one kind among `ops`, with their lock keys.
fn of_kind<'a, T>(
    ops: &'a [(String, Op)],
    pick: impl Fn(&'a Op) -> Option<&'a T>,
) -> Vec<(&'a String, &'a T)> {
    ops.iter()
        .filter_map(|(key, op)| pick(op).map(|picked| (key, picked)))
        .collect()
}

/// `answers` as they are; a `READONLY` among them (the node became a replica: its writes
/// all failed) makes the connection's next request look for the master again.
fn forget_if_replica(
    link: &Connector,
    answers: std::result::Result<Vec<Out>, Failure>,
) -> std::result::Result<Vec<Out>, Failure> {
    if let Ok(answers) = &answers {
        if answers
            .iter()
            .any(|answer| matches!(answer, Out::Refused(message) if is_readonly(message)))
        {
            link.forget();
        }
    }
    answers
}

/// The failure of an answer of the wrong kind (which the group commit never produces).
pub(crate) fn mismatched() -> Failure {
    Failure::Reply("an answer of the wrong kind".into())
}

/// The failure of a request whose node handle went away, or whose group ended unanswered.
fn gone() -> Failure {
    Failure::Reply(
        "the request ended without an answer (node dropped or runtime shutting down)".into(),
    )
}

/// The `n` answers of an [`scripts::ACQUIRE`] or [`scripts::HAND_OVER`] reply: `flag, value` pairs, the value of a
/// `-1` flag being the server's error message for that lock.
fn acquire_answers(reply: &Value, n: usize) -> std::result::Result<Vec<Out>, Failure> {
    let unexpected = || Failure::unexpected(reply);
    match reply {
        Value::Array(items) if items.len() == n * 2 => items
            .chunks(2)
            .map(|pair| match pair {
                [Value::Int(flag), Value::Int(value)] => Ok(Out::Acquire(*flag, *value)),
                [Value::Int(-1), message] => {
                    Ok(Out::Refused(text(message).ok_or_else(unexpected)?))
                }
                _ => Err(unexpected()),
            })
            .collect(),
        _ => Err(unexpected()),
    }
}

/// The `n` answers of a [`scripts::RELEASE`] reply: 1 or 0, or the server's error message
/// for that lock.
fn release_answers(reply: &Value, n: usize) -> std::result::Result<Vec<Out>, Failure> {
    let unexpected = || Failure::unexpected(reply);
    match reply {
        Value::Array(items) if items.len() == n => items
            .iter()
            .map(|item| match item {
                Value::Int(flag) => Ok(Out::Release(*flag)),
                message => Ok(Out::Refused(text(message).ok_or_else(unexpected)?)),
            })
            .collect(),
        _ => Err(unexpected()),
    }
}
