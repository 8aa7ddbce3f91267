//! The relay map's cost at 10, 1,000 and 10,000 mappings (DESIGN.md §7: one change
//! ≤ 10 ms, a full reconcile of 10k ≤ 250 ms, atomic). Runs the same code ssh_mapd runs
//! (`NftCli`), against the real kernel, in a network namespace of its own:
//!
//!     cargo build --release -p byo-relay --example map_bench
//!     unshare --net target/release/examples/map_bench

use std::time::{Duration, Instant};

use byo_core::render::nft::{self, Layout, Mapping};
use byo_relay::nft::NftCli;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() -> anyhow::Result<()> {
    let nft = NftCli;
    let tables = std::process::Command::new("nft")
        .args(["list", "tables"])
        .output()?;
    anyhow::ensure!(
        String::from_utf8_lossy(&tables.stdout).trim().is_empty() || nft.table_exists()?,
        "run me in an empty network namespace: unshare --net {}",
        std::env::args().next().unwrap_or_default()
    );
    nft.ensure(&Layout::default())?;
    println!(
        "{:>8}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}",
        "mappings", "reconcile", "replace", "add new", "clear", "GET /map"
    );
    for n in [10u16, 1_000, 10_000] {
        let all: Vec<Mapping> = (0..n)
            .map(|i| Mapping {
                port: 20_000 + i,
                target_port: 40_000 + i,
            })
            .collect();
        let mut reconcile = Vec::new();
        for _ in 0..5 {
            nft.apply(&nft::reconcile_batch(&[]))?;
            let t = Instant::now();
            nft.apply(&nft::reconcile_batch(&all))?;
            reconcile.push(t.elapsed());
        }
        anyhow::ensure!(
            nft.mappings()?.len() == usize::from(n),
            "reconcile did not take"
        );
        // One change as ssh_mapd makes it: replace a mapped port, add a new one, clear it.
        let mut change = Vec::new();
        for i in 0..50u16 {
            let m = Mapping {
                port: 20_000 + (i % n),
                target_port: 50_000 + i,
            };
            let t = Instant::now();
            nft.set(m)?;
            change.push(t.elapsed());
        }
        let mut add = Vec::new();
        let mut clear = Vec::new();
        for i in 0..20u16 {
            let m = Mapping {
                port: 60_000 + i,
                target_port: 2201,
            };
            let t = Instant::now();
            nft.set(m)?;
            add.push(t.elapsed());
            let t = Instant::now();
            nft.clear(m.port)?;
            clear.push(t.elapsed());
        }
        anyhow::ensure!(
            nft.get(20_000)?.is_some_and(|m| m.target_port >= 50_000),
            "changes did not take"
        );
        let mut listing = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let got = nft.mappings()?;
            listing.push(t.elapsed());
            anyhow::ensure!(got.len() == usize::from(n));
        }
        println!(
            "{:>8}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}",
            n,
            ms(median(reconcile)),
            ms(median(change)),
            ms(median(add)),
            ms(median(clear)),
            ms(median(listing))
        );
    }
    Ok(())
}
