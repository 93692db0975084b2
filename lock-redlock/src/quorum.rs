//! Quorum arithmetic: the majority of N nodes, and how the answers of the nodes to one
//! operation add up to a decision ([`Tally`]).

use lock_core::{Error, Result};

use crate::fanout::Fanout;

/// The quorum of `nodes` nodes: a strict majority, `nodes / 2 + 1`.
pub fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// When an operation stops waiting for the nodes' answers, besides at a quorum of yes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// As soon as no quorum can say yes any more, a failed node counting as a no: acquire
    /// and the fence write-back, whose outcome a failure decides as well as a refusal.
    Unreachable,
    /// At a majority of no. Failures alone never stop it: the operation then waits for
    /// every answer (each bounded by the per-node timeout), so that its count tells "not
    /// held" (a majority refused) from "nodes unreachable": extend and release.
    Refused,
}

/// The answers of `asked` nodes to one operation that needs `needed` of them to say yes: the
/// yes answers (with what each carries, `Y`), the no answers (`N`) and the failures, each
/// with the node's index.
pub(crate) struct Tally<Y = (), N = ()> {
    asked: usize,
    needed: usize,
    stop: Stop,
    pub(crate) yes: Vec<(usize, Y)>,
    pub(crate) no: Vec<(usize, N)>,
    pub(crate) failed: Vec<(usize, Error)>,
}

impl<Y, N> Tally<Y, N> {
    /// No answers yet from the `asked` nodes, of which `needed` must say yes, stopping as
    /// `stop` says.
    pub(crate) fn new(asked: usize, needed: usize, stop: Stop) -> Self {
        Tally {
            asked,
            needed,
            stop,
            yes: Vec::with_capacity(asked),
            no: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// Node `i` said yes.
    pub(crate) fn yes(&mut self, i: usize, carried: Y) {
        self.yes.push((i, carried));
    }

    /// Node `i` said no.
    pub(crate) fn no(&mut self, i: usize, carried: N) {
        self.no.push((i, carried));
    }

    /// Node `i` failed.
    pub(crate) fn fail(&mut self, i: usize, error: Error) {
        self.failed.push((i, error));
    }

    /// A quorum said yes.
    pub(crate) fn reached(&self) -> bool {
        self.yes.len() >= self.needed
    }

    /// So many said no that no quorum can say yes.
    pub(crate) fn refused(&self) -> bool {
        self.no.len() > self.asked.saturating_sub(self.needed)
    }

    /// So many said no or failed that no quorum can say yes.
    pub(crate) fn unreachable(&self) -> bool {
        self.no.len() + self.failed.len() > self.asked.saturating_sub(self.needed)
    }

    /// Whether the operation has its outcome and waits for no more answers (see [`Stop`]).
    pub(crate) fn decided(&self) -> bool {
        self.reached()
            || match self.stop {
                Stop::Unreachable => self.unreachable(),
                Stop::Refused => self.refused(),
            }
    }
}

impl Tally {
    /// Counts `replies` (each `Ok` a yes, each error a failure) until the tally is decided
    /// or every node answered; the replies not taken stay in `replies`.
    pub(crate) async fn count_successes<T: Send + 'static>(
        mut self,
        replies: &mut Fanout<T>,
    ) -> Self {
        while let Some((i, reply)) = replies.next().await {
            match reply {
                Ok(_) => self.yes(i, ()),
                Err(e) => self.fail(i, e),
            }
            if self.decided() {
                break;
            }
        }
        self
    }

    /// Adds node `i`'s answer to a yes/no request.
    pub(crate) fn add(&mut self, i: usize, reply: Result<bool>) {
        match reply {
            Ok(true) => self.yes(i, ()),
            Ok(false) => self.no(i, ()),
            Err(e) => self.fail(i, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure() -> Error {
        Error::unavailable("redlock", std::io::Error::other("down"))
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        let quorums: Vec<usize> = (1..=7).map(quorum).collect();
        assert_eq!(quorums, [1, 2, 2, 3, 3, 4, 4]);
    }

    #[test]
    fn a_quorum_of_yes_decides_whatever_the_stop() {
        for stop in [Stop::Unreachable, Stop::Refused] {
            let mut tally = Tally::new(5, 3, stop);
            tally.add(0, Ok(true));
            tally.add(1, Err(failure()));
            tally.add(2, Ok(true));
            assert!(!tally.decided());
            tally.add(3, Ok(true));
            assert!(tally.decided() && tally.reached() && !tally.refused());
        }
    }

    #[test]
    fn a_majority_of_no_decides_whatever_the_stop() {
        for stop in [Stop::Unreachable, Stop::Refused] {
            let mut tally = Tally::new(5, 3, stop);
            tally.add(0, Ok(false));
            tally.add(1, Ok(false));
            assert!(!tally.decided());
            tally.add(2, Ok(false));
            assert!(tally.decided() && tally.refused() && !tally.reached());
        }
    }

    #[test]
    fn failures_decide_only_when_they_count_as_no() {
        let mut unreachable = Tally::new(5, 3, Stop::Unreachable);
        let mut refused = Tally::new(5, 3, Stop::Refused);
        for tally in [&mut unreachable, &mut refused] {
            tally.add(0, Ok(false));
            tally.add(1, Err(failure()));
            assert!(!tally.decided());
            tally.add(2, Err(failure()));
            assert!(tally.unreachable() && !tally.refused() && !tally.reached());
        }
        assert!(unreachable.decided());
        // Waits on, to tell "not held" from "unreachable" once every node answered.
        assert!(!refused.decided());
        refused.add(3, Ok(false));
        refused.add(4, Ok(false));
        assert!(refused.decided() && refused.refused());
    }

    #[test]
    fn answers_keep_their_node_and_what_they_carry() {
        let mut tally: Tally<u64, Option<u64>> = Tally::new(3, 2, Stop::Unreachable);
        tally.yes(2, 7);
        tally.no(0, Some(5));
        tally.fail(1, failure());
        assert_eq!(tally.yes, [(2, 7)]);
        assert_eq!(tally.no, [(0, Some(5))]);
        assert_eq!(tally.failed.len(), 1);
        assert_eq!(tally.failed[0].0, 1);
        assert!(tally.decided() && tally.unreachable());
    }

    #[test]
    fn a_sub_quorum_counts_its_own_nodes() {
        // The fence write-back: 1 more node needed out of the 2 asked.
        let mut tally: Tally = Tally::new(2, 1, Stop::Unreachable);
        tally.fail(0, failure());
        assert!(!tally.decided());
        tally.yes(1, ());
        assert!(tally.decided() && tally.reached());
        let mut tally: Tally = Tally::new(2, 1, Stop::Unreachable);
        tally.fail(0, failure());
        tally.fail(1, failure());
        assert!(tally.decided() && !tally.reached());
    }
}
