//! `zfs-arc-cap`: step 6 of the list in `docs/prepare.md`.
//!
//! **Check:** `/etc/modprobe.d/enverge-zfs.conf` caps the ARC; if zfs is loaded, its live
//! `zfs_arc_max` is the cap.
//! **Apply:** write the file.
//! **Why here:** modprobe.d binds at module load, and installing LXD loads zfs — so this precedes
//! `lxd-install`.

use byo_core::prepare::Check;

use super::StepDef;
use super::shared::file_is;
use crate::host::{Fallible, Host, read_string};
use crate::prepare::Plan;

pub(crate) const ZFS_CONF: &str = "/etc/modprobe.d/enverge-zfs.conf";

const ZFS_ARC_MAX: &str = "/sys/module/zfs/parameters/zfs_arc_max";

pub(crate) struct ZfsArcCap;

impl StepDef for ZfsArcCap {
    const NAME: &str = "zfs-arc-cap";

    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
        let want = plan.profile.prepare.zfs_arc_max;
        if !file_is(h, ZFS_CONF, &format!("options zfs zfs_arc_max={want}\n"))? {
            return Ok(Check::Needs(format!(
                "cap the ZFS ARC at {want} bytes in {ZFS_CONF}"
            )));
        }
        // modprobe.d binds at module load: a zfs already loaded ignores the file.
        if let Some(live) = read_string(h, ZFS_ARC_MAX)? {
            let live = live.trim();
            if live.parse::<u64>().ok() != Some(want) {
                return Err(format!(
                    "zfs is already loaded with zfs_arc_max={live}: modprobe.d binds at module load, so the cap takes effect only after a reboot. zfs-arc-cap must run before lxd-install, which loads zfs even for a non-zfs pool"
                ));
            }
        }
        Ok(Check::Satisfied)
    }

    fn apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
        let text = format!(
            "options zfs zfs_arc_max={}\n",
            plan.profile.prepare.zfs_arc_max
        );
        h.write(ZFS_CONF, text.as_bytes(), 0o644, "root:root")
    }
}
