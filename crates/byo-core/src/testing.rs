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
