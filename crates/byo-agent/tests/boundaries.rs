//! This binary runs on machines we do not own and must stay small: it never links the
//! server's dependencies. Checked against the resolved dependency graph (`cargo tree`).

use std::collections::BTreeSet;
use std::process::Command;

const FORBIDDEN: &[&str] = &[
    "byo-server",
    "byo-db",
    "sqlx",
    "sqlx-core",
    "axum",
    "argon2",
    "maud",
    "utoipa",
    "prometheus-client",
    "libsqlite3-sys",
    "figment",
];

#[test]
fn links_no_server_dependency() {
    let me = env!("CARGO_PKG_NAME");
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            me,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: BTreeSet<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    assert!(
        names.contains("clap"),
        "the tree lists real dependencies: {names:?}"
    );
    for f in FORBIDDEN {
        assert!(!names.contains(*f), "{me} links {f}");
    }
}
