//! The boundaries ARCHITECTURE.md states, checked against the resolved dependency graph
//! (`cargo tree`), so a new dependency that breaks one fails here.

use std::collections::BTreeSet;
use std::process::Command;

/// Normal (non-dev) dependencies of `package`, or with `invert`, the packages depending on it.
fn tree(args: &[&str]) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The agent and the relay run on machines we do not own and must stay small: an HTTP
/// server (axum on tokio) for their APIs, and nothing of the server's database, password
/// hashing, templates or OpenAPI.
#[test]
fn agent_and_relay_link_no_server_dependency() {
    const FORBIDDEN: &[&str] = &[
        "byo-server",
        "byo-db",
        "sqlx",
        "sqlx-core",
        "axum-extra",
        "argon2",
        "maud",
        "utoipa",
        "prometheus-client",
        "libsqlite3-sys",
        "figment",
    ];
    for binary in ["byo-agent", "byo-relay"] {
        let deps = tree(&["-p", binary]);
        assert!(
            deps.contains("clap"),
            "the tree lists real dependencies: {deps:?}"
        );
        for f in FORBIDDEN {
            assert!(!deps.contains(*f), "{binary} links {f}");
        }
    }
}

/// Only byo-db writes SQL: no other workspace crate depends on sqlx directly.
#[test]
fn only_the_database_crate_links_sqlx() {
    let direct: Vec<String> = tree(&["-i", "sqlx", "--depth", "1"])
        .into_iter()
        .filter(|n| n.starts_with("byo"))
        .collect();
    assert_eq!(direct, ["byo-db"], "crates depending on sqlx directly");
}

/// The server links neither the agent nor the relay: what both sides need (the agent's
/// units, the relay's nftables layout and first-boot script) is rendered in
/// `byo_core::render`, and the wire shapes are in `byo-wire`. Tests may still drive the
/// real agent and relay libraries (dev-dependencies).
#[test]
fn the_server_links_neither_the_agent_nor_the_relay() {
    let deps = tree(&["-p", "byo-server"]);
    assert!(
        deps.contains("byo-core"),
        "the tree lists real dependencies"
    );
    for binary in ["byo-agent", "byo-relay"] {
        assert!(!deps.contains(binary), "byo-server links {binary}");
    }
}
