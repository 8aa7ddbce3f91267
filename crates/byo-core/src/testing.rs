//! The one rule for a test whose component is missing (feature `testing`): locally it skips
//! and says so loudly; under CI it fails. Every crate's tests read it from here, so `CI` is
//! read one way everywhere.

use std::process::Command;

/// Whether this run is CI's: `CI` set to anything but empty, `0` or `false` (CI services
/// set `true`; some set `1`).
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| {
        let v = v.trim();
        !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false")
    })
}

/// `component` is missing (`why` says what to do about it): under CI this panics, since a
/// test that needs a real component must run there; elsewhere it prints a loud SKIPPED
/// line and returns, and the caller skips.
pub fn skip(component: &str, why: &str) {
    assert!(
        !under_ci(),
        "{component} is missing under CI ({why}): a missing component is a failure there, never a skip"
    );
    eprintln!(
        "\n!!!!!!!! SKIPPED ({component}): {why} !!!!!!!!\n\
         (./scripts/test installs and starts what the tests need)\n"
    );
}

/// Whether every program in `tools` is on the PATH; when one is not, [`skip`] with its name.
pub fn have_tools(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|tool| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    skip(&missing.join(", "), "not installed");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_that_exists_is_found() {
        assert!(have_tools(&["sh"]));
    }
}

/// The fuzz targets' shared driver (bolero under `cargo test`, `tests/it/fuzz.rs` of byo-core
/// and byo-relay): the corpus kept in the repository and how a random input is made of it.
pub mod fuzz {
    /// The corpus examples of `target` under `<manifest_dir>/tests/__fuzz__/fuzz__<target>/corpus`.
    pub fn corpus(manifest_dir: &str, target: &str) -> Vec<Vec<u8>> {
        let dir = std::path::Path::new(manifest_dir)
            .join("tests/__fuzz__")
            .join(format!("fuzz__{target}"))
            .join("corpus");
        let mut seeds: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| std::fs::read(e.unwrap().path()).unwrap())
            .collect();
        assert!(!seeds.is_empty(), "{} holds no example", dir.display());
        seeds.sort();
        seeds
    }

    /// One input: raw `bytes`, or (odd first byte) a seed edited by the rest, four bytes an
    /// edit: what (overwrite, insert, delete), where (two bytes), which byte.
    pub fn input(seeds: &[Vec<u8>], bytes: &[u8]) -> Vec<u8> {
        let Some((pick, edits)) = bytes.split_first().filter(|(pick, _)| *pick % 2 == 1) else {
            return bytes.to_vec();
        };
        let mut seed = seeds[usize::from(*pick / 2) % seeds.len()].clone();
        for edit in edits.chunks_exact(4) {
            let at = usize::from(u16::from_be_bytes([edit[1], edit[2]])) % (seed.len() + 1);
            match edit[0] % 3 {
                0 if at < seed.len() => seed[at] = edit[3],
                1 => seed.insert(at, edit[3]),
                2 if at < seed.len() => {
                    seed.remove(at);
                }
                _ => {}
            }
        }
        seed
    }
}

/// The `p` quantile (0 to 1) of latencies in µs, sorted, in ms: what every bench reports.
pub fn percentile_ms(sorted_us: &[u32], p: f64) -> f64 {
    let i = ((sorted_us.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted_us[i]) / 1000.0
}

/// What a benchmark's figure must reach: at least or at most `value`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    AtLeast(f64),
    AtMost(f64),
}

/// One benchmark figure as `scripts/bench` reads it, a line of its own among the bench's
/// human output: `figure`, the bench, what was measured, the value, its unit and the target
/// (`>=N`, `<=N` or `-`), tab-separated. The script tabulates them and says which targets
/// were met; the benches themselves never judge a timing.
pub fn figure_line(
    bench: &str,
    what: &str,
    value: f64,
    unit: &str,
    target: Option<Target>,
) -> String {
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    let target = match target {
        Some(Target::AtLeast(t)) => format!(">={t}"),
        Some(Target::AtMost(t)) => format!("<={t}"),
        None => "-".to_owned(),
    };
    format!(
        "figure\t{}\t{}\t{value:.2}\t{}\t{target}",
        clean(bench),
        clean(what),
        clean(unit)
    )
}

#[cfg(test)]
mod figure_tests {
    use super::*;

    #[test]
    fn a_percentile_is_the_nearest_rank_of_the_sorted_latencies_in_ms() {
        let us = [1_000, 2_000, 3_000, 4_000, 10_000];
        assert_eq!(percentile_ms(&us, 0.0), 1.0);
        assert_eq!(percentile_ms(&us, 0.5), 3.0);
        assert_eq!(percentile_ms(&us, 0.9), 10.0);
        assert_eq!(percentile_ms(&us, 1.0), 10.0);
    }

    #[test]
    fn a_figure_is_one_line_of_six_tab_separated_fields() {
        let line = figure_line(
            "heartbeat",
            "writes/s\t(postgres)\n",
            10_234.567,
            "1/s",
            Some(Target::AtLeast(10_000.0)),
        );
        assert_eq!(
            line,
            "figure\theartbeat\twrites/s (postgres) \t10234.57\t1/s\t>=10000"
        );
        assert_eq!(
            figure_line("map", "reconcile", 0.5, "ms", Some(Target::AtMost(250.0))),
            "figure\tmap\treconcile\t0.50\tms\t<=250"
        );
        assert!(figure_line("x", "y", 1.0, "ms", None).ends_with("\tms\t-"));
    }
}
