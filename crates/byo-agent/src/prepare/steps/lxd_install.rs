//! `lxd-install`: step 7 of the list in `docs/prepare.md`.
//!
//! **Check:** LXD answers `GET /1.0`; spark is in `lxd`.
//! **Apply:** snap (`5.21/stable`) or Debian's package, `lxd waitready`; `usermod -aG lxd spark`.
//! **Why here:** `lxd init` is deliberately never run: the pool and the bridge are their own steps.

use byo_core::prepare::Check;
use byo_wire::profile::{LxdSource};

use super::StepDef;
use super::shared::{SPARK, verdict, lxd_answers};
use crate::host::{Fallible, Host, apt_install, must, user_groups};
use crate::prepare::Plan;

/// Written when lxd-install installed LXD (its source: apt or snap); an LXD that was already
/// here is the owner's, and uninstall leaves it.
pub(crate) const LXD_INSTALLED: &str = "/etc/enverge/lxd-installed";

pub(crate) struct LxdInstall;

impl StepDef for LxdInstall {
    const NAME: &str = "lxd-install";

    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
        let mut needs = Vec::new();
        if !lxd_answers(h) {
            needs.push(match plan.profile.prepare.lxd {
                LxdSource::Snap => "install LXD (snap)".to_owned(),
                other => format!("install LXD ({other}: this profile's alternative to the snap)"),
            });
        }
        if !user_groups(h, SPARK)?.iter().any(|g| g == "lxd") {
            needs.push("add spark to the lxd group (serving talks to LXD as spark)".to_owned());
        }
        Ok(verdict(needs))
    }

    fn apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
        if !lxd_answers(h) {
            // Uninstall removes LXD only when preparation is what installed it; the record
            // comes first, so a run killed during the install still knows.
            h.write(
                LXD_INSTALLED,
                format!("{}\n", plan.profile.prepare.lxd).as_bytes(),
                0o644,
                "root:root",
            )?;
            match plan.profile.prepare.lxd {
                LxdSource::Apt => {
                    // Debian's package only recommends what its bridges need (dnsmasq).
                    apt_install(h, &["lxd", "nftables", "dnsmasq-base"])?;
                    let _ = h.run(
                        &["systemctl", "enable", "--now", "lxd.socket", "lxd.service"],
                        None,
                    )?;
                }
                LxdSource::Snap => {
                    if !h.run(&["snap", "list", "lxd"], None)?.ok() {
                        must(h, &["snap", "install", "lxd", "--channel=5.21/stable"])?;
                    }
                }
            }
            // Nothing else runs `lxd init`: the pool and the bridge are their own steps.
            must(h, &["lxd", "waitready", "--timeout=300"])?;
        }
        if !user_groups(h, SPARK)?.iter().any(|g| g == "lxd") {
            must(h, &["usermod", "-aG", "lxd", SPARK])?;
        }
        Ok(())
    }
}
