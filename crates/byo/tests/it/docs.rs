//! The docs name only what exists (issue #44, 2). `README.md`, `ARCHITECTURE.md` and
//! `docs/*.md` are read, and each name of a kind that has one registry is looked up in it:
//! - an API route (`` `GET /api/…` `` or `` `/api/…` ``): the router's OpenAPI;
//! - a job (`` `x` job ``, `` job `x` ``): `app::jobs::registry()` (docs/jobs.md's table is
//!   checked name by name and period by period in the server's `jobs` suite);
//! - a preparation step: docs/prepare.md's table is the agent's step registry, in order;
//! - a table: docs/data.md's `### …` headings under "Tables" are exactly the tables the
//!   migrations leave, and its "next migration" is the next number;
//! - a configuration key (`` `[section] key` ``): the server's own loader, which refuses a key
//!   it does not know;
//! - a command (`` `byo …` ``, `` `byo-agent …` ``, …): the program's own `--help`.
//!
//! And nothing that exists is called not built: a "Not built" section, or a line saying "not
//! built", names none of the routes, jobs, steps, tables or commands above.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// (path relative to the repository, text) of every document a reader meets.
fn documents() -> Vec<(String, String)> {
    let mut paths = vec!["README.md".to_owned(), "ARCHITECTURE.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(root().join(&p)).unwrap();
            (p, text)
        })
        .collect()
}

/// The text of each `` `…` `` on a line, with its byte range.
fn spans(line: &str) -> Vec<(usize, usize, &str)> {
    let mut out = Vec::new();
    let mut rest = 0;
    while let Some(open) = line[rest..].find('`').map(|i| rest + i) {
        let Some(close) = line[open + 1..].find('`').map(|i| open + 1 + i) else {
            break;
        };
        out.push((open, close + 1, &line[open + 1..close]));
        rest = close + 1;
    }
    out
}

const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE"];

/// The router's OpenAPI: (method, path) of every API route.
fn api_routes() -> BTreeSet<(String, String)> {
    let (_, doc) = byo_server::routes::api().split_for_parts();
    let doc: serde_json::Value = serde_json::from_str(&doc.to_json().unwrap()).unwrap();
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for m in METHODS {
            if item.get(m.to_lowercase()).is_some() {
                out.insert(((*m).to_owned(), path.clone()));
            }
        }
    }
    assert!(out.len() > 50, "read the OpenAPI: {out:?}");
    out
}

/// A documented API route, `(method if named, path)`: `GET /api/vms/{id}` or `/api/vms`.
/// A query, an optional part (`[?…]`) and trailing punctuation are not the path.
fn documented_route(span: &str) -> Option<(Option<&str>, &str)> {
    let (method, path) = match span.split_once(' ') {
        Some((m, p)) if METHODS.contains(&m) => (Some(m), p),
        _ => (None, span),
    };
    if !path.starts_with("/api/") || path.contains('…') || path.contains('*') {
        return None;
    }
    let end = path.find(['?', '[', ' ', ',']).unwrap_or(path.len());
    Some((method, path[..end].trim_end_matches(['.', ')', ':'])))
}

/// Whether a documented path is a registered one: segment by segment, a `{…}` or `<…>`
/// segment matching any.
fn route_matches(registered: &str, documented: &str) -> bool {
    let r: Vec<&str> = registered.split('/').collect();
    let d: Vec<&str> = documented.split('/').collect();
    r.len() == d.len()
        && r.iter()
            .zip(&d)
            .all(|(r, d)| r == d || r.starts_with('{') || d.starts_with('{') || d.starts_with('<'))
}

fn route_exists(routes: &BTreeSet<(String, String)>, method: Option<&str>, path: &str) -> bool {
    routes
        .iter()
        .any(|(m, p)| method.is_none_or(|want| want == m) && route_matches(p, path))
}

fn jobs() -> BTreeSet<String> {
    byo_server::app::jobs::registry()
        .into_iter()
        .map(|j| j.name)
        .collect()
}

/// The tables the migrations leave, statement by statement (0011 drops `vm_queue` and makes
/// it again).
fn tables() -> BTreeSet<String> {
    let dir = root().join("crates/byo-db/migrations/postgres");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut out = BTreeSet::new();
    for f in files {
        let sql = std::fs::read_to_string(&f).unwrap().to_lowercase();
        let words: Vec<&str> = sql
            .split(|c: char| c.is_whitespace() || c == '(' || c == ';')
            .filter(|w| !w.is_empty())
            .collect();
        for w in words.windows(3) {
            match (w[0], w[1]) {
                ("create", "table") => {
                    out.insert(w[2].to_owned());
                }
                ("drop", "table") => {
                    out.remove(w[2]);
                }
                _ => {}
            }
        }
    }
    out
}

/// The highest migration number.
fn last_migration() -> u32 {
    std::fs::read_dir(root().join("crates/byo-db/migrations/postgres"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_string_lossy()[..4].parse().ok())
        .max()
        .unwrap()
}

/// Where a program's binary is (built beside this test by the workspace's build).
fn program(name: &str) -> PathBuf {
    if name == "byo" {
        return PathBuf::from(env!("CARGO_BIN_EXE_byo"));
    }
    crate::support::sibling(name)
}

/// A documented command, `byo keys sign`: the program and its words up to the first that is
/// not a subcommand's spelling (an option, a placeholder, a value).
fn documented_command(span: &str) -> Option<(&str, Vec<&str>)> {
    let mut words = span.split_whitespace();
    let program = words.next()?;
    if !["byo", "byo-agent", "byo-relay", "byo-server"].contains(&program) {
        return None;
    }
    let words: Vec<&str> = words
        .take_while(|w| {
            w.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !w.starts_with('-')
        })
        .collect();
    Some((program, words))
}

/// Whether the program knows the command: its `--help` answers.
fn command_exists(program_name: &str, words: &[&str]) -> bool {
    let out = Command::new(program(program_name))
        .args(words)
        .arg("--help")
        .output()
        .unwrap();
    out.status.success()
}

/// A `[section] key` the docs name, and whether the server's loader knows it.
fn config_key_known(section: &str, key: Option<&str>) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("byo.toml");
    let body = match key {
        Some(k) => format!("[{section}]\n{k} = \"probe\"\n"),
        None => format!("[{section}]\n"),
    };
    std::fs::write(&file, body).unwrap();
    match byo_server::Config::load(Some(&file)) {
        Err(e) if e.to_string().contains("unknown field") => Err(e.to_string()),
        _ => Ok(()),
    }
}

/// `[section] key` or `[section]` at the start of a span.
fn documented_config(span: &str) -> Option<(&str, Option<&str>)> {
    let rest = span.strip_prefix('[')?;
    let (section, after) = rest.split_once(']')?;
    if section.is_empty()
        || !section
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
    {
        return None;
    }
    let key = after
        .split_whitespace()
        .next()
        .filter(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
    Some((section, key))
}

#[test]
fn every_api_route_the_docs_name_is_in_the_openapi() {
    let routes = api_routes();
    let mut wrong = Vec::new();
    for (doc, text) in documents() {
        for (n, line) in text.lines().enumerate() {
            for (_, _, span) in spans(line) {
                if let Some((method, path)) = documented_route(span)
                    && !route_exists(&routes, method, path)
                {
                    wrong.push(format!("{doc}:{}: `{span}`", n + 1));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "routes that do not exist:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_job_the_docs_name_is_registered() {
    let jobs = jobs();
    let mut wrong = Vec::new();
    let mut seen = 0;
    for (doc, text) in documents() {
        for (n, line) in text.lines().enumerate() {
            for (start, end, span) in spans(line) {
                let named = line[end..].starts_with(" job") || line[..start].ends_with("job ");
                if named && span.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
                    seen += 1;
                    if !jobs.contains(span) {
                        wrong.push(format!("{doc}:{}: `{span}`", n + 1));
                    }
                }
            }
        }
    }
    assert!(seen > 5, "the docs name jobs as `x` job: {seen}");
    assert!(
        wrong.is_empty(),
        "jobs that do not exist:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn docs_prepare_md_lists_exactly_the_registered_steps_in_order() {
    let text = std::fs::read_to_string(root().join("docs/prepare.md")).unwrap();
    let listed: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let mut cells = l.split('|').map(str::trim).skip(1);
            let n = cells.next()?;
            let step = cells.next()?;
            (n.parse::<u32>().is_ok() && step.starts_with('`'))
                .then(|| step.split('`').nth(1).unwrap().to_owned())
        })
        .collect();
    assert_eq!(listed, byo_agent::prepare::steps::STEP_NAMES);
}

#[test]
fn docs_data_md_describes_exactly_the_tables_the_migrations_make() {
    let text = std::fs::read_to_string(root().join("docs/data.md")).unwrap();
    let start = text.find("\n## Tables").expect("a Tables section");
    let section = &text[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let described: BTreeSet<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .flat_map(|h| h.split(',').map(|t| t.trim().to_owned()))
        .collect();
    let made = tables();
    assert!(made.len() > 20, "read the migrations: {made:?}");
    let undocumented: Vec<_> = made.difference(&described).collect();
    let gone: Vec<_> = described.difference(&made).collect();
    assert!(
        undocumented.is_empty() && gone.is_empty(),
        "docs/data.md: tables not described {undocumented:?}; described but not made {gone:?}"
    );
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let next = format!("the next migration is {:04}", last_migration() + 1);
    assert!(flat.contains(&next), "docs/data.md says \"{next}\"");
}

#[test]
fn every_configuration_key_the_docs_name_is_one_the_server_reads() {
    let mut wrong = Vec::new();
    let mut seen = 0;
    for (doc, text) in documents() {
        for (n, line) in text.lines().enumerate() {
            for (_, _, span) in spans(line) {
                if let Some((section, key)) = documented_config(span) {
                    seen += 1;
                    if let Err(e) = config_key_known(section, key) {
                        wrong.push(format!("{doc}:{}: `{span}`: {e}", n + 1));
                    }
                }
            }
        }
    }
    assert!(
        seen > 5,
        "the docs name configuration as `[section] key`: {seen}"
    );
    assert!(
        wrong.is_empty(),
        "keys the server does not read:\n{}",
        wrong.join("\n")
    );
    // The probe itself: a key that does not exist is refused.
    assert!(config_key_known("billing", Some("no_such_key")).is_err());
    assert!(config_key_known("billing", Some("owner_share_bps")).is_ok());
}

#[test]
fn every_command_the_docs_name_is_one_its_program_has() {
    let mut checked: BTreeSet<(String, Vec<String>)> = BTreeSet::new();
    let mut wrong = Vec::new();
    for (doc, text) in documents() {
        for (n, line) in text.lines().enumerate() {
            for (_, _, span) in spans(line) {
                let Some((program, words)) = documented_command(span) else {
                    continue;
                };
                let key = (
                    program.to_owned(),
                    words.iter().map(|w| (*w).to_owned()).collect(),
                );
                if checked.insert(key) && !command_exists(program, &words) {
                    wrong.push(format!("{doc}:{}: `{span}`", n + 1));
                }
            }
        }
    }
    assert!(checked.len() > 10, "the docs name commands: {checked:?}");
    assert!(
        wrong.is_empty(),
        "commands that do not exist:\n{}",
        wrong.join("\n")
    );
    assert!(
        !command_exists("byo", &["no-such-command"]),
        "the probe refuses"
    );
}

/// Whether a heading opens a "Not built" section.
fn not_built_heading(line: &str) -> Option<usize> {
    let level = line.chars().take_while(|&c| c == '#').count();
    (level > 0 && line.to_lowercase().contains("not built")).then_some(level)
}

#[test]
fn nothing_that_exists_is_called_not_built() {
    let routes = api_routes();
    let jobs = jobs();
    let steps: BTreeSet<&str> = byo_agent::prepare::steps::STEP_NAMES
        .iter()
        .copied()
        .collect();
    let tables = tables();
    let mut wrong = Vec::new();
    for (doc, text) in documents() {
        let mut inside: Option<usize> = None;
        for (n, line) in text.lines().enumerate() {
            let level = line.chars().take_while(|&c| c == '#').count();
            if level > 0 {
                inside = not_built_heading(line).or(inside.filter(|&l| level > l));
                continue;
            }
            if inside.is_none() && !line.to_lowercase().contains("not built") {
                continue;
            }
            for (_, _, span) in spans(line) {
                let exists = documented_route(span)
                    .is_some_and(|(m, p)| route_exists(&routes, m, p))
                    || jobs.contains(span)
                    || steps.contains(span)
                    || tables.contains(span)
                    || documented_command(span)
                        .is_some_and(|(p, w)| !w.is_empty() && command_exists(p, &w));
                if exists {
                    wrong.push(format!("{doc}:{}: `{span}` exists", n + 1));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "called not built, but built:\n{}",
        wrong.join("\n")
    );
}

/// The number a word spells, as the docs write counts: digits, or a word up to twenty.
fn count_word(word: &str) -> Option<usize> {
    const WORDS: &[&str] = &[
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
        "twenty",
    ];
    let word = word.to_lowercase();
    word.parse()
        .ok()
        .or_else(|| WORDS.iter().position(|w| *w == word))
}

/// Every count of jobs `text` states: the number before "jobs" (or "background jobs",
/// "scheduled jobs"), across line breaks.
fn job_counts(text: &str) -> Vec<(String, usize)> {
    let words: Vec<&str> = text
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()))
        .collect();
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let noun = match words.get(i + 1) {
            Some(&"background" | &"scheduled") => words.get(i + 2),
            next => next,
        };
        if noun == Some(&"jobs")
            && let Some(n) = count_word(w)
        {
            out.push((format!("{w} jobs"), n));
        }
    }
    out
}

/// The source paths `text` names: each word starting `crates/` or `src/` (a placeholder or
/// a glob, `crates/*/src`, is not a path), cut at a `::function` that follows it.
fn source_paths(text: &str) -> Vec<(String, Option<String>)> {
    text.split(|c: char| c.is_whitespace() || "`()[]|,;\"'".contains(c))
        .filter(|w| w.starts_with("crates/") || w.starts_with("src/"))
        .filter(|w| !w.contains(['*', '…', '<', '{']))
        .map(|w| {
            let (path, function) = match w.split_once("::") {
                Some((p, f)) => (p, Some(f.trim_end_matches(['.', ':']).to_owned())),
                None => (w.trim_end_matches(['.', ':']), None),
            };
            (path.to_owned(), function)
        })
        .collect()
}

/// Whether a named source path exists: `crates/…` from the repository's root, `src/…` in
/// some crate.
fn source_path_exists(path: &str) -> bool {
    if path.starts_with("crates/") {
        return root().join(path).exists();
    }
    std::fs::read_dir(root().join("crates"))
        .unwrap()
        .any(|c| c.unwrap().path().join(path).exists())
}

/// ARCHITECTURE.md stays a map a newcomer reads in ten minutes, and a true one (issue #37):
/// - it is under 15,000 bytes — detail belongs in module docs and `docs/`;
/// - every source path it names (`crates/…`, or `src/…` in some crate) exists, and a
///   `path.rs::name` names a function `name` of that file (the invariants' tests);
/// - every count of jobs it states ("twelve jobs") is the number of jobs in
///   `app::jobs::registry()`; docs/jobs.md's count is held to the same.
#[test]
fn architecture_md_is_a_short_true_map() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    assert!(
        text.len() < 15_000,
        "ARCHITECTURE.md is {} bytes: at 15,000 or more it is no longer a map; move detail to \
         the module's //! docs or to docs/",
        text.len()
    );

    let named = source_paths(&text);
    assert!(named.len() > 20, "read the paths: {named:?}");
    let mut wrong = Vec::new();
    for (path, function) in &named {
        if !source_path_exists(path) {
            wrong.push(format!("`{path}` does not exist"));
        } else if let Some(f) = function {
            let code = std::fs::read_to_string(root().join(path)).unwrap_or_default();
            if !code.contains(&format!("fn {f}(")) && !code.contains(&format!("fn {f}<")) {
                wrong.push(format!("`{path}` has no function `{f}`"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md names what does not exist:\n{}",
        wrong.join("\n")
    );

    let registered = jobs().len();
    let mut counts = 0;
    for doc in ["ARCHITECTURE.md", "docs/jobs.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        for (said, n) in job_counts(&text) {
            counts += 1;
            assert_eq!(
                n, registered,
                "{doc} says \"{said}\"; app::jobs::registry() holds {registered}"
            );
        }
    }
    assert!(counts >= 2, "both documents state how many jobs there are");
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `a–b` (en dash or hyphen) or `a`: the numbers it spans.
fn number_range(word: &str) -> Option<(u32, u32)> {
    match word.split_once(['–', '-']) {
        Some((a, b)) => {
            let (a, b) = (a.parse().ok()?, b.parse().ok()?);
            (a < b).then_some((a, b))
        }
        None => word.parse().ok().map(|n| (n, n)),
    }
}

/// A section tag: a letter A–N with digits, `.N` or both (`E1`, `L2.3`, `G.4`), and at least
/// one digit. A bare letter is too ambiguous in prose ("A", "I") to read as a tag.
fn section_tag(word: &str) -> bool {
    if !word.starts_with(|c: char| ('A'..='N').contains(&c)) {
        return false;
    }
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match word[1..].split_once('.') {
        None => digits(&word[1..]),
        Some((sub, note)) => (sub.is_empty() || digits(sub)) && digits(note),
    }
}

/// What a comment cites, each as the alternatives the glossary may spell it by: one of the
/// alternatives in every inner list must be a span of the glossary.
fn citations(comment: &str) -> Vec<(String, Vec<Vec<String>>)> {
    let words: Vec<&str> = comment
        .split_whitespace()
        .map(|w| {
            let w = w.trim_matches(|c: char| "()[],;:\"`*!?".contains(c));
            let w = w
                .strip_suffix("'s")
                .or_else(|| w.strip_suffix("’s"))
                .unwrap_or(w);
            w.trim_end_matches(['.', ',', ':', ';', ')'])
        })
        .collect();
    let mut out = Vec::new();
    // One requirement per number of `a–b`: the range as written, else each number.
    let range = |written: String, (a, b): (u32, u32), one: &dyn Fn(u32) -> String| {
        if a == b {
            vec![vec![one(a)]]
        } else {
            (a..=b).map(|k| vec![written.clone(), one(k)]).collect()
        }
    };
    for (i, w) in words.iter().enumerate() {
        let next = words.get(i + 1).copied().unwrap_or("");
        let after = words.get(i + 2).copied().unwrap_or("");
        // `L4.1–2`: a note range on a tag.
        let (tag, tail) = match w.split_once('–') {
            Some((t, n)) if n.bytes().all(|b| b.is_ascii_digit()) => (t, Some(n)),
            _ => (*w, None),
        };
        if section_tag(tag) {
            match (tag.rsplit_once('.'), tail) {
                (Some((head, a)), Some(b)) => {
                    if let Some(r) = number_range(&format!("{a}–{b}")) {
                        out.push((
                            w.to_string(),
                            range(w.to_string(), r, &|k| format!("{head}.{k}")),
                        ));
                    }
                }
                _ => out.push((tag.to_owned(), vec![vec![tag.to_owned()]])),
            }
        }
        // `K1 note 11`, `J notes 5–6`, `L rule 4`, `E0 caller 5`, `G trigger 5`.
        let prefix = *w;
        let letter = prefix
            .chars()
            .next()
            .is_some_and(|c| ('A'..='N').contains(&c))
            && prefix[1..].bytes().all(|b| b.is_ascii_digit());
        let kind = next.strip_suffix('s').unwrap_or(next);
        if letter
            && ["note", "rule", "caller", "trigger"].contains(&kind)
            && let Some(r) = number_range(after)
        {
            let written = format!("{prefix} {kind}s {after}").replace('-', "–");
            let one = |k: u32| match kind {
                "note" => format!("{prefix}.{k}"),
                _ => format!("{prefix} {kind} {k}"),
            };
            out.push((format!("{prefix} {next} {after}"), range(written, r, &one)));
        }
        // `step 44`, `steps 28–29`; not "step 12 of the list" (the prepare registry's).
        if (w.eq_ignore_ascii_case("step") || w.eq_ignore_ascii_case("steps"))
            && let Some(r) = number_range(next)
            && !(words.get(i + 2) == Some(&"of") && words.get(i + 4) == Some(&"list"))
        {
            let written = format!("steps {next}").replace('-', "–");
            out.push((
                format!("{w} {next}"),
                range(written, r, &|k| format!("step {k}")),
            ));
        }
    }
    out
}

/// Every design tag a comment under `crates/*/src` cites has its line in docs/glossary.md
/// (issue #37). A comment is what follows `//` on a line (`///` and `//!` too); the
/// glossary's tags are its `` `…` `` spans. Read from a comment, each looked up as a span:
/// - a section tag: a letter A–N with a number, a `.N` or both — `E1`, `L2.3`, `G.4`, and
///   `L4.1–2` as `L4.1` and `L4.2` (a bare letter is not read: "A" and "I" are words);
/// - a note, rule, caller or trigger of a section: `K1 note 11` as `K1.11`, `L rule 4`,
///   `E0's caller 5` and `G's trigger 5` as `E0 caller 5` and `G trigger 5`;
/// - a design step: `step 44`; but not "step 12 of the list", a place in the prepare
///   registry (docs/prepare.md).
///
/// A range (`K2 notes 3–5`, `steps 28–29`) is found as one line for the range as written
/// (`steps 28–29`, with an en dash), else as a line for each of its numbers.
#[test]
fn every_design_tag_a_comment_cites_is_in_the_glossary() {
    let glossary = std::fs::read_to_string(root().join("docs/glossary.md")).unwrap();
    let defined: BTreeSet<String> = glossary
        .lines()
        .flat_map(|l| spans(l).into_iter().map(|(_, _, s)| s.to_owned()))
        .collect();
    let mut files = Vec::new();
    for krate in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = krate.unwrap().path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    files.sort();
    let mut missing: BTreeSet<String> = BTreeSet::new();
    let mut seen = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let Some((_, comment)) = line.split_once("//") else {
                continue;
            };
            for (cited, needs) in citations(comment) {
                seen += 1;
                for alternatives in needs {
                    if !alternatives.iter().any(|a| defined.contains(a)) {
                        let rel = file.strip_prefix(root()).unwrap_or(file);
                        missing.insert(format!(
                            "{}:{}: {cited} (needs `{}`)",
                            rel.display(),
                            n + 1,
                            alternatives.last().unwrap()
                        ));
                    }
                }
            }
        }
    }
    assert!(seen > 200, "read the comments' tags: {seen}");
    assert!(
        missing.is_empty(),
        "design tags cited in comments with no line in docs/glossary.md:\n{}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
}
