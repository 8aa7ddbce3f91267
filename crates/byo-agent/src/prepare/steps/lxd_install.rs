//! `lxd-install`: step 7 of the list in `docs/prepare.md`.
//!
//! **Check:** LXD answers `GET /1.0`; spark is *not* in `lxd`; with Debian's package, its unit
//! waits for the daemon a short while ([`APT_DROP_IN`]).
//! **Apply:** snap (`5.21/stable`) or Debian's package (and the drop-in, `daemon-reload`), `lxd
//! waitready`; `gpasswd --delete spark lxd` where an earlier build added it.
//! **Why here:** `lxd init` is deliberately never run: the pool and the bridge are their own steps.
//! **Why spark stays out of `lxd`** (issue #36, reversing the design's "Host configuration after
//! go-live", whose second point says this step once gained `usermod -aG lxd`): a member of
//! `lxd` is root — it can create a privileged container or hand one the host's `/`. Serving reaches LXD through root's gate
//! (`crate::lxd_gate`), which forwards only what serving does; a satellite's LXD is reached as
//! spark through `sudo`, as everything there is.

use byo_core::prepare::Check;
use byo_wire::profile::LxdSource;

use super::StepDef;
use super::shared::{SPARK, lxd_answers, verdict};
use crate::host::{Fallible, Host, apt_install, must, user_groups};
use crate::prepare::Plan;

/// Written when lxd-install installed LXD (its source: apt or snap); an LXD that was already
/// here is the owner's, and uninstall leaves it.
pub(crate) const LXD_INSTALLED: &str = "/etc/enverge/lxd-installed";

/// Debian's `lxd.service` waits for its daemon for ten minutes after starting it
/// (`ExecStartPost=lxd waitready --timeout=600`). A daemon killed during that wait (seen on the
/// nested test hosts at boot, right after it brought lxdbr0 up) leaves the unit in start-post
/// for those ten minutes, and its `Restart=on-failure` never fires: serving, which restores the
/// instance only once LXD answers (L2), waits with it. Half a minute, then systemd's restart.
pub(crate) const APT_DROP_IN: &str = "/etc/systemd/system/lxd.service.d/10-enverge.conf";
pub(crate) const APT_DROP_IN_TEXT: &str = "# Written by enverge preparation (lxd-install): a daemon that dies while starting is\n# started again within a minute, not left in start-post for ten.\n[Service]\nExecStartPost=\nExecStartPost=/usr/bin/lxd waitready --timeout=30\n";

pub(crate) struct LxdInstall;

fn in_lxd_group<H: Host>(h: &mut H) -> Fallible<bool> {
    Ok(user_groups(h, SPARK)?.iter().any(|g| g == "lxd"))
}

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
        if in_lxd_group(h)? {
            needs.push(
                "take spark out of the lxd group (serving reaches LXD through root's gate)"
                    .to_owned(),
            );
        }
        if plan.profile.prepare.lxd == LxdSource::Apt
            && crate::host::read_string(h, APT_DROP_IN)?.as_deref() != Some(APT_DROP_IN_TEXT)
        {
            needs.push(format!(
                "write {APT_DROP_IN} (a daemon that dies while starting is restarted within a minute)"
            ));
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
        if in_lxd_group(h)? {
            must(h, &["gpasswd", "--delete", SPARK, "lxd"])?;
        }
        if plan.profile.prepare.lxd == LxdSource::Apt
            && crate::host::read_string(h, APT_DROP_IN)?.as_deref() != Some(APT_DROP_IN_TEXT)
        {
            h.write(APT_DROP_IN, APT_DROP_IN_TEXT.as_bytes(), 0o644, "root:root")?;
            must(h, &["systemctl", "daemon-reload"])?;
        }
        Ok(())
    }
}
