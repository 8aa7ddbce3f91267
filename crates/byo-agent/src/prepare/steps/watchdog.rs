//! `watchdog`: step 5 of the list in `docs/prepare.md`.
//!
//! **Check:** `RuntimeWatchdogSec` drop-in.
//! **Apply:** write it, `daemon-reexec`.
//! **Why here:** Skipped, with the reason, when `/dev/watchdog` is absent.

use byo_core::prepare::Check;

use super::StepDef;
use super::shared::{file_is, verdict};
use crate::host::{Fallible, Host, exists, must};
use crate::prepare::Plan;

pub(crate) const WATCHDOG_CONF: &str = "/etc/systemd/system.conf.d/enverge-watchdog.conf";

const WATCHDOG: &str = "[Manager]\nRuntimeWatchdogSec=30s\nRebootWatchdogSec=10min\n";

pub(crate) struct Watchdog;

impl StepDef for Watchdog {
    const NAME: &str = "watchdog";

    fn skip<H: Host>(h: &mut H, _: &Plan) -> Option<String> {
        match exists(h, "/dev/watchdog") {
            Ok(true) => None,
            Ok(false) => {
                Some("no hardware watchdog on this board (/dev/watchdog is absent)".into())
            }
            Err(e) => Some(format!("could not look for /dev/watchdog: {e}")),
        }
    }

    fn check<H: Host>(h: &mut H, _: &Plan) -> Fallible<Check> {
        Ok(verdict(if file_is(h, WATCHDOG_CONF, WATCHDOG)? {
            vec![]
        } else {
            vec![format!("arm systemd's hardware watchdog ({WATCHDOG_CONF})")]
        }))
    }

    fn apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
        h.write(WATCHDOG_CONF, WATCHDOG.as_bytes(), 0o644, "root:root")?;
        must(h, &["systemctl", "daemon-reexec"]).map(drop)
    }
}
