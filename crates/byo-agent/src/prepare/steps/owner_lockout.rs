//! `owner-lockout`: step 18 of the list in `docs/prepare.md`.
//!
//! **Check:** operator access re-verified (else it refuses); sshd admits only spark
//! (`/etc/ssh/sshd_config.d/00-enverge-lockout.conf`); the owner's password locked; the owner in no
//! admin group.
//! **Apply:** write the drop-in, `sshd -t` (removed again if refused), reload sshd, `usermod
//! --lock`, `gpasswd --delete`.
//! **Why here:** Skipped while `hosts.lockout_owner` is false (it ships false: the owner's login is
//! the recovery path).

use byo_core::prepare::Check;

use super::StepDef;
use super::operator_access::problems;
use super::shared::{SPARK, file_is, verdict};
use crate::host::{Fallible, Host, must, read_string, user_exists, user_groups};
use crate::prepare::{OWNER_FILE, Plan};

pub(crate) const LOCKOUT_CONF: &str = "/etc/ssh/sshd_config.d/00-enverge-lockout.conf";

const LOCKOUT: &str =
    "# Written by enverge preparation (owner-lockout): one administrator, us.\nAllowUsers spark\n";

pub(crate) const ADMIN_GROUPS: &[&str] = &["sudo", "admin", "wheel", "lxd", "docker"];

/// The admin groups owner-lockout took the owner out of, one per line: uninstall gives them
/// back (design H.3, "restore the owner before removing ourselves").
pub(crate) const OWNER_GROUPS: &str = "/etc/enverge/owner-groups";

pub(crate) struct OwnerLockout;

impl StepDef for OwnerLockout {
    const NAME: &str = "owner-lockout";

    fn skip<H: Host>(_: &mut H, plan: &Plan) -> Option<String> {
        (!plan.lockout_owner).then(|| {
            "hosts.lockout_owner is false: the owner's own login stays as the recovery path"
                .to_owned()
        })
    }

    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
        // Prove our access before removing theirs: the reverse strands a box neither party
        // can administer.
        if let Some(why) = operator_access_unverified(h, plan)? {
            return Ok(Check::Needs(why));
        }
        let owner = owner(h, plan)?;
        if owner == SPARK || owner == "root" {
            return Err(format!(
                "the recorded owner login {owner:?} is not an owner's"
            ));
        }
        let mut needs = Vec::new();
        if !file_is(h, LOCKOUT_CONF, LOCKOUT)? {
            needs.push(format!("admit only spark to sshd ({LOCKOUT_CONF})"));
        }
        if user_exists(h, &owner)? {
            let status = must(h, &["passwd", "-S", &owner])?;
            if status.split_whitespace().nth(1) != Some("L") {
                needs.push(format!("lock {owner}'s password"));
            }
            let groups = user_groups(h, &owner)?;
            for g in ADMIN_GROUPS {
                if groups.iter().any(|x| x == g) {
                    needs.push(format!("remove {owner} from {g}"));
                }
            }
        }
        Ok(verdict(needs))
    }

    fn apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
        if let Some(why) = operator_access_unverified(h, plan)? {
            return Err(why);
        }
        let owner = owner(h, plan)?;
        h.write(LOCKOUT_CONF, LOCKOUT.as_bytes(), 0o644, "root:root")?;
        if let Err(e) = must(h, &["sshd", "-t"]) {
            h.remove(LOCKOUT_CONF)?;
            return Err(format!(
                "sshd refused the lockout configuration, so it was removed: {e}"
            ));
        }
        for unit in ["ssh.service", "sshd.service"] {
            if h.run(&["systemctl", "reload", unit], None)?.ok() {
                break;
            }
        }
        if user_exists(h, &owner)? {
            must(h, &["usermod", "--lock", &owner])?;
            let groups = user_groups(h, &owner)?;
            let taken: Vec<&str> = ADMIN_GROUPS
                .iter()
                .copied()
                .filter(|g| groups.iter().any(|x| x == g))
                .collect();
            // Recorded before any is taken, so uninstall can give every one back.
            super::shared::record(h, OWNER_GROUPS, &taken)?;
            for g in taken {
                must(h, &["gpasswd", "--delete", &owner, g])?;
            }
        }
        Ok(())
    }
}

fn owner<H: Host>(h: &mut H, plan: &Plan) -> Fallible<String> {
    if let Some(o) = &plan.owner {
        return Ok(o.clone());
    }
    read_string(h, OWNER_FILE)?
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("the owner's login is not recorded ({OWNER_FILE})"))
}

fn operator_access_unverified<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Option<String>> {
    let problems = problems(h, plan)?;
    Ok((!problems.is_empty()).then(|| {
        format!(
            "operator access is not verified ({}); the owner's login is left alone",
            problems.join("; ")
        )
    }))
}
