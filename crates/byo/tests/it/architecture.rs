//! The boundaries ARCHITECTURE.md states, checked against the resolved dependency graph
//! (`cargo tree`), so a new dependency that breaks one fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
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

// --- reading a crate's modules from its source --------------------------------------------

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the crate's source is readable") {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `a::{b::{self, C}, d}` → [a, b, self], [a, b, C], [a, d].
fn expand(tree: &str) -> Vec<Vec<String>> {
    let tree = tree.trim();
    if let Some(inner) = tree.strip_prefix('{') {
        let inner = inner.strip_suffix('}').unwrap_or(inner);
        let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&inner[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        items.push(&inner[start..]);
        return items
            .into_iter()
            .filter(|i| !i.trim().is_empty())
            .flat_map(expand)
            .collect();
    }
    let end = tree
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(tree.len());
    let (head, rest) = tree.split_at(end);
    match rest.trim_start().strip_prefix("::") {
        Some(rest) => expand(rest)
            .into_iter()
            .map(|mut p| {
                p.insert(0, head.to_owned());
                p
            })
            .collect(),
        None => vec![vec![head.to_owned()]],
    }
}

/// Every path written after `crate::` in `code`.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        let mut depth = 0;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth > 0 => depth -= 1,
                c if depth > 0 && (c == ',' || c.is_whitespace()) => {}
                c if c.is_alphanumeric() || c == '_' || c == ':' => {}
                _ => {
                    end = i;
                    break;
                }
            }
            if depth == 0 && c == '}' {
                end = i + 1;
                break;
            }
        }
        out.extend(expand(&rest[..end]));
    }
    out
}

/// Each source file of `krate` as (its module path, its code without comments and tests,
/// `super::` written out): `routes/vms.rs` is [routes, vms], `pages/mod.rs` is [pages].
fn modules_of(krate: &str) -> Vec<(Vec<String>, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../{krate}/src"));
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // Each file's module path: `routes/vms.rs` is [routes, vms], `pages/mod.rs` is [pages].
    let mut modules: Vec<(Vec<String>, String)> = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap().with_extension("");
        let mut path: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if path.last().is_some_and(|l| l == "mod") {
            path.pop();
        }
        // The crate root and the binary name modules without `crate::`; nothing imports them.
        if path == ["lib"] || path == ["main"] {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        // Test modules sit at the end of a file; they are not part of the layering.
        let text = text.split("#[cfg(test)]").next().unwrap();
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap())
            .collect::<Vec<_>>()
            .join("\n");
        let parent = if path.len() > 1 {
            format!("crate::{}::", path[..path.len() - 1].join("::"))
        } else {
            "crate::".to_owned()
        };
        modules.push((path, code.replace("super::", &parent)));
    }
    modules
}

/// Every way a module of `graph` comes back to itself, written out (`a → b → a`).
fn cycles_in(graph: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut cycles = Vec::new();
    for start in graph.keys() {
        // Depth-first from `start`, remembering the way, to show the cycle if there is one.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, way)) = stack.pop() {
            for next in graph.get(&at).into_iter().flatten() {
                if next == start {
                    cycles.push(format!("{} → {start}", way.join(" → ")));
                } else if seen.insert(next.clone()) {
                    let mut way = way.clone();
                    way.push(next.clone());
                    stack.push((next.clone(), way));
                }
            }
        }
    }
    cycles
}

/// The server's layers, read from its source: every `crate::…` (and `super::…`) path in
/// `crates/byo-server/src`, outside `#[cfg(test)]` modules, as an edge between modules —
/// top-level modules, and `routes::X`, `pages::X` and `app::X` on their own. Routes never
/// import routes (`routes::X` reaches neither `routes::Y` nor the router); pages never
/// import routes; app never imports routes or pages; and no two top-level modules import
/// each other, directly or round a longer cycle.
#[test]
fn server_modules_keep_their_layers_and_form_no_cycle() {
    use std::collections::BTreeMap;

    const LAYERED: &[&str] = &["routes", "pages", "app"];

    let modules = modules_of("byo-server");
    let tops: BTreeSet<String> = modules.iter().map(|(p, _)| p[0].clone()).collect();
    let subs: BTreeSet<(String, String)> = modules
        .iter()
        .filter(|(p, _)| p.len() > 1)
        .map(|(p, _)| (p[0].clone(), p[1].clone()))
        .collect();
    let node = |p: &[String]| -> String {
        if LAYERED.contains(&p[0].as_str())
            && p.len() > 1
            && subs.contains(&(p[0].clone(), p[1].clone()))
        {
            format!("{}::{}", p[0], p[1])
        } else {
            p[0].clone()
        }
    };
    let mut edges: BTreeSet<(String, String)> = BTreeSet::new();
    for (path, code) in &modules {
        let from = node(path);
        for to in crate_paths(code) {
            if !tops.contains(&to[0]) {
                continue; // an item of the crate root, such as `crate::REAP_EVERY`
            }
            let to = node(&to);
            if to != from {
                edges.insert((from.clone(), to));
            }
        }
    }
    assert!(
        edges.contains(&("pages::instances".into(), "app::instances".into())),
        "the scan reads the source: {edges:?}"
    );

    let layer = |n: &str| n.split("::").next().unwrap().to_owned();
    let mut broken = Vec::new();
    for (from, to) in &edges {
        let (lf, lt) = (layer(from), layer(to));
        let refused = matches!(
            (lf.as_str(), lt.as_str()),
            ("routes" | "pages", "routes") | ("app", "routes" | "pages")
        );
        if refused {
            broken.push(format!("{from} imports {to}"));
        }
    }
    assert!(
        broken.is_empty(),
        "routes never import routes, pages never import routes, app never imports routes or pages: {broken:#?}"
    );

    // Cycles between top-level modules: any module that reaches itself again.
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in &edges {
        let (from, to) = (layer(from), layer(to));
        if from != to {
            graph.entry(from).or_default().insert(to);
        }
    }
    let cycles = cycles_in(&graph);
    assert!(
        cycles.is_empty(),
        "top-level modules of byo-server import each other in a cycle: {cycles:#?}"
    );

    // Inside app (issue #37): the rules stand on one another without a circle, so each reads
    // from the ones below it — the queue and the power wait under the instance, the instance
    // under the drain, the bookings and the host lifecycle, the customer's power over both.
    let mut rules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in &edges {
        if from.starts_with("app::") && to.starts_with("app::") {
            rules.entry(from.clone()).or_default().insert(to.clone());
        }
    }
    assert!(
        rules["app::queue_drain"].contains("app::instances")
            && rules["app::instances"].contains("app::queued"),
        "the scan reads app: {rules:?}"
    );
    let cycles = cycles_in(&rules);
    assert!(
        cycles.is_empty(),
        "modules of byo-server's app import each other in a cycle: {cycles:#?}"
    );
}

/// The agent's floors (issue #37, 1): at the bottom, modules that import nothing of the agent
/// but one another — the host's command runner and files (`host`, `lxd`), the names and paths
/// every part agrees on (`names`), the machines a host spans as preparation hands them over
/// (`machines`), the re-prepare lock (`lock`), the report client and the rollback record —
/// and above them no two modules that reach each other again. A floor that imports a unit, or
/// a circle such as the old `prepare → workers → prepare`, fails here.
#[test]
fn agent_modules_stand_on_floors_and_form_no_cycle() {
    use std::collections::BTreeMap;

    const FLOORS: &[&str] = &[
        "host", "lxd", "names", "machines", "lock", "report", "rollback",
    ];
    let modules = modules_of("byo-agent");
    let tops: BTreeSet<String> = modules.iter().map(|(p, _)| p[0].clone()).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, code) in &modules {
        for to in crate_paths(code) {
            if tops.contains(&to[0]) && to[0] != path[0] {
                graph
                    .entry(path[0].clone())
                    .or_default()
                    .insert(to[0].clone());
            }
        }
    }
    assert!(
        graph["vms"].contains("names") && graph["serve"].contains("vms"),
        "the scan reads the source: {graph:?}"
    );
    for floor in FLOORS {
        assert!(tops.contains(*floor), "{floor} is a module of the agent");
    }
    let up: Vec<String> = graph
        .iter()
        .filter(|(from, _)| FLOORS.contains(&from.as_str()))
        .flat_map(|(from, to)| {
            to.iter()
                .filter(|t| !FLOORS.contains(&t.as_str()))
                .map(move |t| format!("{from} imports {t}"))
        })
        .collect();
    assert!(up.is_empty(), "a floor imports only floors: {up:#?}");
    let cycles = cycles_in(&graph);
    assert!(
        cycles.is_empty(),
        "top-level modules of byo-agent import each other in a cycle: {cycles:#?}"
    );

    // The agent's units are peers (issue #37): what two of them share (the hand-over, the
    // build's version, the names of files) sits on a floor, so a unit reads another only
    // where it runs it — preparation enrols, serving beats, uninstall reads what preparation
    // recorded it wrote (`prepare::steps::written`) and nothing else of preparation's.
    const UNITS: &[&str] = &[
        "enroll",
        "prepare",
        "serve",
        "heartbeat",
        "uninstall",
        "upgrade",
    ];
    const RUNS: &[(&str, &str)] = &[
        ("prepare", "enroll"),
        ("serve", "heartbeat"),
        ("uninstall", "prepare"),
    ];
    let crossed: Vec<String> = graph
        .iter()
        .filter(|(from, _)| UNITS.contains(&from.as_str()))
        .flat_map(|(from, to)| {
            to.iter()
                .filter(|t| UNITS.contains(&t.as_str()))
                .filter(|t| !RUNS.contains(&(from.as_str(), t.as_str())))
                .map(move |t| format!("{from} imports {t}"))
        })
        .collect();
    assert!(crossed.is_empty(), "a unit reads another: {crossed:#?}");
    let read: BTreeSet<String> = modules
        .iter()
        .filter(|(path, _)| path[0] == "uninstall")
        .flat_map(|(_, code)| crate_paths(code))
        .filter(|to| to[0] == "prepare")
        .map(|to| to.join("::"))
        .collect();
    assert!(
        !read.is_empty()
            && read
                .iter()
                .all(|p| p.starts_with("prepare::steps::written")),
        "uninstall reads of preparation only what it recorded it wrote: {read:?}"
    );
}

/// The rules (`byo-server`'s `app/`) answer with outcomes and `AppError`s, never with HTTP
/// statuses (issue #37, 3): which status an outcome becomes is the edge's (`error.rs`,
/// `routes`, `pages`). So no file under `app/` names `StatusCode` or `axum::http`.
#[test]
fn the_rules_name_no_http_status() {
    let app = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../byo-server/src/app");
    let mut named = Vec::new();
    for entry in std::fs::read_dir(&app).expect("the rules' source is readable") {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        for (n, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap();
            if line.contains("StatusCode") || line.contains("axum::http") {
                named.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(named.is_empty(), "app/ names HTTP statuses: {named:#?}");
}

/// The server's rules match outcomes, never names (issue #37, 3): a database refusal is a
/// `byo_db::Rule` (constraint names are mapped once, in byo-db) and the no-capacity answer's
/// code is byo-wire's, so no file of byo-server's source asks `is_constraint` or spells
/// `"no_capacity"`.
#[test]
fn the_server_matches_rules_not_constraint_names() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../byo-server/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "the scan reads the server: {files:?}");
    let named: Vec<String> = files
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            text.lines()
                .enumerate()
                .filter(|(_, l)| l.contains("is_constraint(") || l.contains("\"no_capacity\""))
                .map(|(n, l)| format!("{}:{}: {}", path.display(), n + 1, l.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(named.is_empty(), "the server matches names: {named:#?}");
}

/// "Skip locally, fail under CI" is read from `CI` in one place, `byo_core::testing`
/// (issue #19 found two helpers reading it two ways): no other Rust file of the workspace
/// names the variable in an environment read.
#[test]
fn ci_is_read_in_one_place() {
    use std::path::{Path, PathBuf};
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    rust_files(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    rust_files(&crates, &mut files);
    let the_one = crates
        .join("byo-core/src/testing.rs")
        .canonicalize()
        .unwrap();
    // Spelled in pieces so this file does not match itself.
    let reads = [
        format!("var({q}CI{q})", q = '"'),
        format!("var_os({q}CI{q})", q = '"'),
        format!("env!({q}CI{q})", q = '"'),
        format!("option_env!({q}CI{q})", q = '"'),
    ];
    let mut readers = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        if reads.iter().any(|r| text.contains(r.as_str())) {
            readers.push(f.canonicalize().unwrap());
        }
    }
    assert_eq!(
        readers,
        [the_one],
        "CI is read only by byo_core::testing::under_ci"
    );
}
