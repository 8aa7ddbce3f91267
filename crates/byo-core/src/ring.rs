//! A ring's routes (K2 note 7), as a pure decision: on a switchless ring every node forwards
//! IP and carries a route to each rail it is not on, through the neighbour that is — so the
//! diagonal reaches the head, and the head the diagonal. A pair has no such rail: every rail
//! is on both machines, and nothing here fires.

use std::net::Ipv4Addr;

/// One node's rail addresses (`a.b.c.d/len`), by node index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddrs {
    pub index: u32,
    pub addresses: Vec<String>,
}

/// A route a node carries: to a rail's subnet, through a neighbour's address on a rail both
/// are on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The subnet (`a.b.c.0/len`) of a rail this node is not on.
    pub to: String,
    /// The neighbour's address on a rail this node is on.
    pub via: String,
}

fn parse(cidr: &str) -> Option<(Ipv4Addr, u8)> {
    let (a, len) = cidr.split_once('/')?;
    let len: u8 = len.parse().ok().filter(|l| *l <= 32)?;
    Some((a.parse().ok()?, len))
}

/// The subnet an address (`a.b.c.d/len`) is on.
pub fn subnet(cidr: &str) -> Option<String> {
    let (a, len) = parse(cidr)?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Some(format!("{}/{len}", Ipv4Addr::from(u32::from(a) & mask)))
}

/// The routes node `me` carries: for each rail (subnet) some other node is on and `me` is not,
/// through the lowest-indexed neighbour on both that rail and one of `me`'s own. None on a pair.
pub fn routes(nodes: &[NodeAddrs], me: u32) -> Vec<Route> {
    let subnets = |n: &NodeAddrs| -> Vec<(String, String)> {
        n.addresses
            .iter()
            .filter_map(|a| Some((subnet(a)?, parse(a)?.0.to_string())))
            .collect()
    };
    let Some(mine) = nodes.iter().find(|n| n.index == me).map(subnets) else {
        return Vec::new();
    };
    let on_mine = |s: &str| mine.iter().any(|(m, _)| m == s);
    let mut others: Vec<&NodeAddrs> = nodes.iter().filter(|n| n.index != me).collect();
    others.sort_by_key(|n| n.index);
    let mut wanted: Vec<String> = others
        .iter()
        .flat_map(|n| subnets(n).into_iter().map(|(s, _)| s))
        .filter(|s| !on_mine(s))
        .collect();
    wanted.sort();
    wanted.dedup();
    wanted
        .into_iter()
        .filter_map(|to| {
            // A neighbour: on `to`, and on one of my rails, where its address is the way.
            others.iter().find_map(|n| {
                let theirs = subnets(n);
                theirs.iter().any(|(s, _)| *s == to).then_some(())?;
                let (_, via) = theirs.iter().find(|(s, _)| on_mine(s))?;
                Some(Route {
                    to: to.clone(),
                    via: via.clone(),
                })
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(index: u32, addresses: &[&str]) -> NodeAddrs {
        NodeAddrs {
            index,
            addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    /// The bed's ring: cables 0–1 (rail 0), 0–3 (rail 1), 1–2 (rail 2), 2–3 (rail 3).
    fn ring() -> Vec<NodeAddrs> {
        vec![
            node(0, &["192.168.100.10/24", "192.168.101.10/24"]),
            node(1, &["192.168.100.11/24", "192.168.102.11/24"]),
            node(2, &["192.168.102.12/24", "192.168.103.12/24"]),
            node(3, &["192.168.101.13/24", "192.168.103.13/24"]),
        ]
    }

    fn r(to: &str, via: &str) -> Route {
        Route {
            to: to.into(),
            via: via.into(),
        }
    }

    #[test]
    fn each_node_reaches_the_rails_it_is_not_on_through_the_neighbour_that_is() {
        let nodes = ring();
        assert_eq!(
            routes(&nodes, 0),
            [
                r("192.168.102.0/24", "192.168.100.11"),
                r("192.168.103.0/24", "192.168.101.13")
            ]
        );
        // The diagonal reaches node0's rails through node1 and node3.
        assert_eq!(
            routes(&nodes, 2),
            [
                r("192.168.100.0/24", "192.168.102.11"),
                r("192.168.101.0/24", "192.168.103.13")
            ]
        );
        assert_eq!(
            routes(&nodes, 1),
            [
                r("192.168.101.0/24", "192.168.100.10"),
                r("192.168.103.0/24", "192.168.102.12")
            ]
        );
    }

    #[test]
    fn a_pair_needs_no_route() {
        let pair = vec![
            node(0, &["192.168.100.10/24", "192.168.101.10/24"]),
            node(1, &["192.168.100.11/24", "192.168.101.11/24"]),
        ];
        assert!(routes(&pair, 0).is_empty());
        assert!(routes(&pair, 1).is_empty());
        // A node not in the list, or an address that does not read, routes nothing.
        assert!(routes(&pair, 7).is_empty());
        assert!(
            routes(
                &[node(0, &["nonsense"]), node(1, &["192.168.100.11/24"])],
                0
            )
            .is_empty()
        );
    }

    #[test]
    fn a_subnet_is_the_address_under_its_mask() {
        assert_eq!(
            subnet("192.168.100.11/24").as_deref(),
            Some("192.168.100.0/24")
        );
        assert_eq!(subnet("10.1.2.3/16").as_deref(), Some("10.1.0.0/16"));
        assert_eq!(subnet("10.1.2.3/0").as_deref(), Some("0.0.0.0/0"));
        assert_eq!(subnet("10.1.2.3/33"), None);
    }
}
