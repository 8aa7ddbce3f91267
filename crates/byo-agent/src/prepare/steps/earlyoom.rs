//! `earlyoom`: step 4 of the list in `docs/prepare.md`.
//!
//! **Check:** installed, `/etc/default/earlyoom` as rendered, enabled and running; **swap off**.
//! **Apply:** install, configure, enable, restart; refuses while swap is on.
//! **Why here:** earlyoom fires only when MemAvailable AND free swap are low; a GPU runaway cannot
//! be swapped.

use byo_core::prepare::Check;

use super::StepDef;
use super::shared::{file_is, swaps, verdict};
use crate::host::{
    Fallible, Host, apt_install, must, package_installed, unit_active, unit_enabled,
};
use crate::prepare::Plan;

const EARLYOOM_DEFAULTS: &str = "/etc/default/earlyoom";

const EARLYOOM_ARGS: &str =
    "EARLYOOM_ARGS=\"-m 5 -r 3600 --avoid '(^|/)(sshd|systemd|lxd|byo-agent)$'\"\n";

pub(crate) struct Earlyoom;

impl StepDef for Earlyoom {
    const NAME: &str = "earlyoom";

    fn check<H: Host>(h: &mut H, _: &Plan) -> Fallible<Check> {
        if let Some(why) = disarmed(h)? {
            return Ok(Check::Needs(why));
        }
        let mut needs = Vec::new();
        if !package_installed(h, "earlyoom")? {
            needs.push("install earlyoom".to_owned());
        }
        if !file_is(h, EARLYOOM_DEFAULTS, EARLYOOM_ARGS)? {
            needs.push(format!("write {EARLYOOM_DEFAULTS}"));
        }
        if !unit_active(h, "earlyoom.service")? || !unit_enabled(h, "earlyoom.service")? {
            needs.push("enable and start earlyoom".to_owned());
        }
        Ok(verdict(needs))
    }

    fn apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
        if let Some(why) = disarmed(h)? {
            return Err(why);
        }
        if !package_installed(h, "earlyoom")? {
            apt_install(h, &["earlyoom"])?;
        }
        h.write(
            EARLYOOM_DEFAULTS,
            EARLYOOM_ARGS.as_bytes(),
            0o644,
            "root:root",
        )?;
        must(h, &["systemctl", "enable", "earlyoom.service"])?;
        must(h, &["systemctl", "restart", "earlyoom.service"]).map(drop)
    }
}

/// earlyoom acts only when MemAvailable AND free swap are both low: with swap on it never
/// fires on a GPU runaway, which cannot be swapped.
fn disarmed<H: Host>(h: &mut H) -> Fallible<Option<String>> {
    let on = swaps(h)?;
    Ok((!on.is_empty()).then(|| {
        format!(
            "earlyoom would be disarmed: it acts only when MemAvailable AND free swap are both low, and swap is on ({}); a GPU runaway cannot be swapped, so swap-off must run first",
            on.join(", ")
        )
    }))
}
