//! Fuzzing ssh_mapd's API (#16 item 9) with `bolero` on the stable toolchain: the bodies of
//! `PUT /map` and `PUT /map/{port}` and the path's port, through the same parsing and
//! `mapd::validate` the handlers run. Under `cargo test` each target runs the examples in
//! `tests/__fuzz__/fuzz__<target>/corpus/` and then `ITERATIONS` random inputs
//! (`BOLERO_RANDOM_ITERATIONS` overrides), half raw bytes and half an example with bytes
//! overwritten, inserted or deleted. Whatever is accepted maps only the relay's :22 to a
//! port on its one host.

use bolero::check;
use byo_core::render::nft::Layout;
use byo_core::testing::fuzz::{self, input};
use byo_relay::mapd::{MAPPABLE_PORTS, validate};
use byo_wire::relay::{MapTarget, SshMap};

const ITERATIONS: usize = 20_000;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    fuzz::corpus(env!("CARGO_MANIFEST_DIR"), target)
}

fn accepted(layout: &Layout, port: u16, target: &str, target_port: u16) -> bool {
    match validate(layout, port, target, target_port) {
        Ok(m) => {
            assert!(MAPPABLE_PORTS.contains(&m.port), "{port} mapped");
            assert_eq!((m.port, m.target_port), (port, target_port));
            assert_eq!(target.parse::<std::net::Ipv4Addr>().ok(), Some(layout.host));
            assert_ne!(target_port, 0);
            true
        }
        Err(why) => {
            assert!(!why.is_empty());
            false
        }
    }
}

/// `PUT /map`: a whole map.
#[test]
fn ssh_map() {
    let seeds = corpus("ssh_map");
    let layout = Layout::default();
    check!()
        .with_iterations(ITERATIONS)
        .for_each(|bytes: &[u8]| {
            let data = input(&seeds, bytes);
            let Ok(map) = serde_json::from_slice::<SshMap>(&data) else {
                return;
            };
            let again: SshMap = serde_json::from_slice(&serde_json::to_vec(&map).unwrap()).unwrap();
            assert_eq!(again, map, "an accepted map round-trips");
            for e in &map.mappings {
                accepted(&layout, e.port, &e.target, e.target_port);
            }
        });
}

/// `PUT /map/{port}`: the path's port (as the handler parses it) and the body.
#[test]
fn map_port() {
    let seeds = corpus("map_port");
    let layout = Layout::default();
    check!()
        .with_iterations(ITERATIONS)
        .for_each(|bytes: &[u8]| {
            let data = input(&seeds, bytes);
            // The first line is the path's port, the rest the body.
            let text = String::from_utf8_lossy(&data);
            let (port, body) = text.split_once('\n').unwrap_or((&text, ""));
            let Ok(port) = port.parse::<u16>() else {
                return;
            };
            let Ok(target) = serde_json::from_str::<MapTarget>(body) else {
                return;
            };
            let again: MapTarget =
                serde_json::from_str(&serde_json::to_string(&target).unwrap()).unwrap();
            assert_eq!(again, target);
            accepted(&layout, port, &target.target, target.target_port);
        });
}
