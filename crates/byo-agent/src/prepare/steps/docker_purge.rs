//! `docker-purge`: step 2 of the list in `docs/prepare.md`.
//!
//! **Check:** no Docker package; iptables FORWARD policy not DROP; no `docker0`.
//! **Apply:** disable, `apt-get purge`, `iptables -P FORWARD ACCEPT`, delete `docker0` (purging
//! leaves it).
//! **Why here:** Docker's FORWARD DROP breaks lxdbr0's NAT, so the image build loses egress.
//! **Recorded:** the packages purged, in [`DOCKER_REMOVED`] first: uninstall offers them back.

use byo_core::prepare::Check;

use super::StepDef;
use super::shared::{record, verdict};
use crate::host::{Fallible, Host, apt_purge, must, package_installed};
use crate::prepare::Plan;

/// The Docker packages docker-purge removed, one per line (uninstall's `docker` step).
pub(crate) const DOCKER_REMOVED: &str = "/etc/enverge/docker-removed";

const DOCKER_PACKAGES: &[&str] = &[
    "docker.io",
    "docker-ce",
    "docker-ce-cli",
    "docker-ce-rootless-extras",
    "docker-buildx-plugin",
    "docker-compose-plugin",
    "containerd.io",
];

pub(crate) struct DockerPurge;

impl StepDef for DockerPurge {
    const NAME: &str = "docker-purge";

    fn check<H: Host>(h: &mut H, _: &Plan) -> Fallible<Check> {
        let mut needs = Vec::new();
        let installed = docker_installed(h)?;
        if !installed.is_empty() {
            needs.push(format!("purge {}", installed.join(", ")));
        }
        if forward_policy(h)?.as_deref() == Some("DROP") {
            needs.push(
                "set the iptables FORWARD policy back to ACCEPT (Docker's DROP breaks lxdbr0's NAT)"
                    .to_owned(),
            );
        }
        if h.run(&["ip", "link", "show", "docker0"], None)?.ok() {
            needs.push("remove the docker0 bridge".to_owned());
        }
        Ok(verdict(needs))
    }

    fn apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
        let installed = docker_installed(h)?;
        if !installed.is_empty() {
            let _ = h.run(
                &[
                    "systemctl",
                    "disable",
                    "--now",
                    "docker.socket",
                    "docker.service",
                    "containerd.service",
                ],
                None,
            )?;
            record(h, DOCKER_REMOVED, &installed)?;
            apt_purge(h, &installed)?;
        }
        if forward_policy(h)?.as_deref() == Some("DROP") {
            must(h, &["iptables", "-P", "FORWARD", "ACCEPT"])?;
        }
        if h.run(&["ip", "link", "show", "docker0"], None)?.ok() {
            must(h, &["ip", "link", "delete", "docker0"])?;
        }
        Ok(())
    }
}

fn forward_policy<H: Host>(h: &mut H) -> Fallible<Option<String>> {
    let out = h.run(&["iptables", "-S", "FORWARD"], None)?;
    Ok(out
        .ok()
        .then(|| {
            out.stdout
                .lines()
                .find_map(|l| l.strip_prefix("-P FORWARD ").map(|p| p.trim().to_owned()))
        })
        .flatten())
}

fn docker_installed<H: Host>(h: &mut H) -> Fallible<Vec<&'static str>> {
    let mut found = Vec::new();
    for p in DOCKER_PACKAGES {
        if package_installed(h, p)? {
            found.push(*p);
        }
    }
    Ok(found)
}
