//! The relay map's cost at 10, 1,000 and 10,000 mappings (DESIGN.md §7: one change
//! ≤ 10 ms, a full reconcile of 10k ≤ 250 ms, atomic). Runs the same code ssh_mapd runs
//! (`NftCli`), against the real kernel, in a network namespace of its own:
//!
//!     cargo build --release -p byo-relay --example map_bench
//!     unshare --net target/release/examples/map_bench [--sizes 10,1000,10000]

use std::time::{Duration, Instant};

use byo_core::render::nft::{self, Layout, Mapping};
use byo_core::testing::{Target, figure_line};
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
    let mut sizes = vec![10u16, 1_000, 10_000];
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        anyhow::ensure!(arg == "--sizes", "unknown argument {arg}");
        sizes = args
            .next()
            .unwrap_or_default()
            .split(',')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("--sizes takes numbers: {e}"))?;
    }
    for n in sizes {
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
        let (reconcile, change, add, clear) = (
            median(reconcile),
            median(change),
            median(add),
            median(clear),
        );
        println!(
            "{:>8}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}",
            n,
            ms(reconcile),
            ms(change),
            ms(add),
            ms(clear),
            ms(median(listing))
        );
        let at = |d: Duration| d.as_secs_f64() * 1e3;
        let reconcile_target = (n == 10_000).then_some(Target::AtMost(250.0));
        // Each change ssh_mapd makes is held to the target (docs/relay.md says why removing
        // an element costs more on this kernel).
        for (what, value, target) in [
            ("reconcile", at(reconcile), reconcile_target),
            ("add a mapping", at(add), Some(Target::AtMost(10.0))),
            ("replace one", at(change), Some(Target::AtMost(10.0))),
            ("clear one", at(clear), Some(Target::AtMost(10.0))),
        ] {
            println!(
                "{}",
                figure_line(
                    "map_bench",
                    &format!("{what} at {n} mappings"),
                    value,
                    "ms",
                    target
                )
            );
        }
    }
    Ok(())
}
