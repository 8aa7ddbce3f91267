//! `swap-off`: step 3 of the list in `docs/prepare.md`.
//!
//! **Check:** `/proc/swaps` empty; no active swap line in `/etc/fstab`.
//! **Apply:** `swapoff -a`, comment the fstab lines.
//! **Why here:** What arms earlyoom.
//! **Recorded:** the devices that were on, in [`SWAP_WAS_ON`] first: uninstall turns them on.

use byo_core::prepare::Check;

use super::StepDef;
use super::shared::{record, swaps, verdict};
use crate::host::{Fallible, Host, must, read_string};
use crate::prepare::Plan;

/// What swap-off puts before each swap line it comments out of /etc/fstab (uninstall takes
/// it away again).
pub(crate) const SWAP_DISABLED: &str = "# disabled by enverge (swap disarms earlyoom): ";

/// The swap devices that were on when swap-off turned them off, one per line.
pub(crate) const SWAP_WAS_ON: &str = "/etc/enverge/swap-was-on";

pub(crate) struct SwapOff;

impl StepDef for SwapOff {
    const NAME: &str = "swap-off";

    fn check<H: Host>(h: &mut H, _: &Plan) -> Fallible<Check> {
        let mut needs = Vec::new();
        let on = swaps(h)?;
        if !on.is_empty() {
            needs.push(format!("turn off swap on {}", on.join(", ")));
        }
        let fstab = read_string(h, "/etc/fstab")?.unwrap_or_default();
        if !fstab_swap_lines(&fstab).is_empty() {
            needs.push(
                "comment out the swap lines in /etc/fstab, so a reboot does not turn it back on"
                    .to_owned(),
            );
        }
        Ok(verdict(needs))
    }

    fn apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
        let on = swaps(h)?;
        record(
            h,
            SWAP_WAS_ON,
            &on.iter().map(String::as_str).collect::<Vec<_>>(),
        )?;
        must(h, &["swapoff", "-a"])?;
        if let Some(fstab) = read_string(h, "/etc/fstab")? {
            let swap = fstab_swap_lines(&fstab);
            if !swap.is_empty() {
                let text: String = fstab
                    .lines()
                    .map(|l| {
                        if swap.contains(&l) {
                            format!("{SWAP_DISABLED}{l}\n")
                        } else {
                            format!("{l}\n")
                        }
                    })
                    .collect();
                h.write("/etc/fstab", text.as_bytes(), 0o644, "root:root")?;
            }
        }
        Ok(())
    }
}

fn fstab_swap_lines(fstab: &str) -> Vec<&str> {
    fstab
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            !l.trim_start().starts_with('#') && f.get(2) == Some(&"swap")
        })
        .collect()
}
