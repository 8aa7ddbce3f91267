//! Lockstep (K1 note 11, L rule 4): the worker exists and runs exactly when the head does.
//!
//! A pair's instance is the head on node0 and `<head>-w1` on node1 (a ring's `-w1…-w3` on its
//! satellites). node0's agent keeps them together: at a create and a delete, at a start or a
//! stop, when serving starts (L2: LXD, the head, then the workers, then the relay) and on every
//! heartbeat (L3: a satellite restarting). This module is the decision: given what node0 runs
//! and what each satellite answered, the moves that bring the workers in step, and the reasons
//! the pair is half a pair. The agent gathers the facts and makes the moves (`byo-agent::vms`).
//!
//! What no move can mend is reported, never invented: a worker that is missing while its head
//! exists cannot be made again here (the head's launcher key is inside the head, and a create is
//! the customer's), and a satellite that does not answer is not waited for (L2.4, L4.3).

use std::fmt;

/// The worker of `head` on satellite `node`: `<head>-w<node>`.
pub fn worker_name(head: &str, node: u32) -> String {
    format!("{head}-w{node}")
}

/// The longest head name whose workers still fit LXD's 63-character instance names on a host
/// of `nodes` machines (one satellite: `-w1`; up to nine: still three characters).
pub fn longest_head(nodes: u32) -> usize {
    if nodes <= 1 {
        return 63;
    }
    63 - worker_name("", nodes - 1).len()
}

/// node0's instance, as LXD holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub name: String,
    pub running: bool,
}

/// One of our containers on a satellite: a worker, with the head it was made for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    pub name: String,
    /// The head it serves (recorded on the container when it was made).
    pub head: String,
    pub running: bool,
}

/// What one satellite answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Satellite {
    /// Its LXD answered: our containers there.
    Holds(Vec<Worker>),
    /// Its LXD could not be asked (the machine is down or restarting, the LAN, its LXD): why.
    Unreachable(String),
}

/// A move on one satellite's container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Move {
    Start {
        node: u32,
        worker: String,
    },
    Stop {
        node: u32,
        worker: String,
    },
    /// A worker whose head is gone (or another head's): it goes.
    Delete {
        node: u32,
        worker: String,
    },
}

impl Move {
    pub fn node(&self) -> u32 {
        match self {
            Move::Start { node, .. } | Move::Stop { node, .. } | Move::Delete { node, .. } => *node,
        }
    }
    pub fn worker(&self) -> &str {
        match self {
            Move::Start { worker, .. }
            | Move::Stop { worker, .. }
            | Move::Delete { worker, .. } => worker,
        }
    }
}

impl fmt::Display for Move {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Move::Start { node, worker } => write!(f, "start {worker} on node{node}"),
            Move::Stop { node, worker } => write!(f, "stop {worker} on node{node}"),
            Move::Delete { node, worker } => write!(f, "delete {worker} on node{node}"),
        }
    }
}

/// Why a host is half a pair (L3.3): lands on the heartbeat's `lxd` as degraded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Half {
    /// The satellite did not answer.
    Unreachable { node: u32, why: String },
    /// The head exists and its worker on this satellite does not.
    NoWorker { node: u32, head: String },
}

impl fmt::Display for Half {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Half::Unreachable { node, why } => {
                write!(
                    f,
                    "node{node} cannot be reached over the management network: {why}"
                )
            }
            Half::NoWorker { node, head } => write!(
                f,
                "node{node} holds no worker for {head} ({} is missing)",
                worker_name(head, *node)
            ),
        }
    }
}

/// The decision: the moves to make, and what no move mends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keep {
    pub moves: Vec<Move>,
    pub half: Vec<Half>,
}

/// Bring each satellite in step with `head` (none: node0 holds no instance). `satellites` is
/// `(node index, what it answered)`, node indexes from 1.
pub fn keep(head: Option<&Head>, satellites: &[(u32, Satellite)]) -> Keep {
    let mut out = Keep::default();
    for (node, seen) in satellites {
        let node = *node;
        let workers = match seen {
            Satellite::Unreachable(why) => {
                out.half.push(Half::Unreachable {
                    node,
                    why: why.clone(),
                });
                continue;
            }
            Satellite::Holds(workers) => workers,
        };
        let ours = head.map(|h| worker_name(&h.name, node));
        let mut found = false;
        for w in workers {
            let belongs =
                head.is_some_and(|h| w.head == h.name) && ours.as_deref() == Some(w.name.as_str());
            if !belongs {
                out.moves.push(Move::Delete {
                    node,
                    worker: w.name.clone(),
                });
                continue;
            }
            found = true;
            let want_running = head.is_some_and(|h| h.running);
            if want_running && !w.running {
                out.moves.push(Move::Start {
                    node,
                    worker: w.name.clone(),
                });
            } else if !want_running && w.running {
                out.moves.push(Move::Stop {
                    node,
                    worker: w.name.clone(),
                });
            }
        }
        if let (Some(h), false) = (head, found) {
            out.half.push(Half::NoWorker {
                node,
                head: h.name.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(running: bool) -> Head {
        Head {
            name: "vm-a".into(),
            running,
        }
    }
    fn worker(name: &str, head: &str, running: bool) -> Worker {
        Worker {
            name: name.into(),
            head: head.into(),
            running,
        }
    }

    #[test]
    fn a_running_head_starts_its_stopped_worker_and_a_stopped_head_stops_it() {
        let w = |running| {
            vec![(
                1,
                Satellite::Holds(vec![worker("vm-a-w1", "vm-a", running)]),
            )]
        };
        assert_eq!(
            keep(Some(&head(true)), &w(false)).moves,
            vec![Move::Start {
                node: 1,
                worker: "vm-a-w1".into()
            }]
        );
        assert_eq!(
            keep(Some(&head(false)), &w(true)).moves,
            vec![Move::Stop {
                node: 1,
                worker: "vm-a-w1".into()
            }]
        );
        for running in [true, false] {
            assert_eq!(keep(Some(&head(running)), &w(running)), Keep::default());
        }
    }

    #[test]
    fn a_worker_without_its_head_goes_and_so_does_another_heads() {
        let sats = vec![(
            1,
            Satellite::Holds(vec![
                worker("vm-old-w1", "vm-old", true),
                // Named like ours but made for another head: not ours.
                worker("vm-a-w1", "vm-b", false),
            ]),
        )];
        let none = keep(None, &sats);
        assert_eq!(none.moves.len(), 2);
        assert!(none.moves.iter().all(|m| matches!(m, Move::Delete { .. })));
        assert!(none.half.is_empty(), "an idle pair is whole");
        let with = keep(Some(&head(true)), &sats);
        assert_eq!(with.moves.len(), 2, "{with:?}");
        assert_eq!(
            with.half,
            vec![Half::NoWorker {
                node: 1,
                head: "vm-a".into()
            }]
        );
        assert_eq!(
            with.half[0].to_string(),
            "node1 holds no worker for vm-a (vm-a-w1 is missing)"
        );
    }

    #[test]
    fn an_unreachable_satellite_is_half_a_pair_and_waits_for_nothing() {
        for h in [None, Some(head(true))] {
            let k = keep(
                h.as_ref(),
                &[(1, Satellite::Unreachable("no route to host".into()))],
            );
            assert!(k.moves.is_empty());
            assert_eq!(
                k.half[0].to_string(),
                "node1 cannot be reached over the management network: no route to host"
            );
        }
    }

    #[test]
    fn a_ring_is_kept_satellite_by_satellite() {
        let sats = vec![
            (1, Satellite::Holds(vec![worker("vm-a-w1", "vm-a", true)])),
            (2, Satellite::Holds(vec![worker("vm-a-w2", "vm-a", false)])),
            (3, Satellite::Unreachable("down".into())),
        ];
        let k = keep(Some(&head(true)), &sats);
        assert_eq!(
            k.moves,
            vec![Move::Start {
                node: 2,
                worker: "vm-a-w2".into()
            }]
        );
        assert_eq!(k.half.len(), 1);
        assert_eq!(k.moves[0].to_string(), "start vm-a-w2 on node2");
    }

    #[test]
    fn each_move_names_its_node_its_worker_and_itself() {
        let moves = [
            (
                Move::Start {
                    node: 2,
                    worker: "vm-a-w2".into(),
                },
                "start vm-a-w2 on node2",
            ),
            (
                Move::Stop {
                    node: 3,
                    worker: "vm-a-w3".into(),
                },
                "stop vm-a-w3 on node3",
            ),
            (
                Move::Delete {
                    node: 1,
                    worker: "vm-b-w1".into(),
                },
                "delete vm-b-w1 on node1",
            ),
        ];
        for (m, said) in &moves {
            assert_eq!(m.to_string(), *said);
            assert!(said.contains(m.worker()) && said.ends_with(&format!("node{}", m.node())));
        }
        let [a, b, c] = moves.map(|(m, _)| (m.node(), m.worker().to_owned()));
        assert_eq!(
            [a, b, c],
            [
                (2, "vm-a-w2".into()),
                (3, "vm-a-w3".into()),
                (1, "vm-b-w1".into())
            ]
        );
    }

    #[test]
    fn worker_names_fit_lxds_limit() {
        assert_eq!(worker_name("vm-a", 1), "vm-a-w1");
        assert_eq!(longest_head(1), 63);
        assert_eq!(longest_head(2), 60);
        assert_eq!(longest_head(4), 60);
        // A tenth machine's worker is `-w9`; an eleventh's `-w10`, one character longer.
        assert_eq!(longest_head(10), 60);
        assert_eq!(longest_head(11), 59);
        let longest = "a".repeat(longest_head(2));
        assert_eq!(worker_name(&longest, 1).len(), 63);
    }
}
