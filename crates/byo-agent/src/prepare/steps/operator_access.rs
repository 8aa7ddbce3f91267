//! `operator-access`: step 1 of the list in `docs/prepare.md`.
//!
//! **Check:** `spark` exists; `/etc/sudoers.d/enverge-spark` is `NOPASSWD:ALL` and `runuser -u
//! spark -- sudo -n true` works; spark's authorized_keys is the kept signed list; `sshd -T` for
//! spark accepts public keys and admits spark; sshd runs; with a connector token, cloudflared is
//! installed and its unit runs it.
//! **Apply:** `useradd`, the sudoers drop-in validated with `visudo -cf` before it lands,
//! authorized_keys 0600, sshd enabled; with a connector token and no cloudflared, the build
//! enrolment pinned, fetched and checked against its SHA-256 before it is installed 0755 at
//! `/usr/local/bin/cloudflared`; cloudflared unit with `--token-file`.
//! **Why here:** Proves Enverge's access — it is re-verified by `owner-lockout` before the owner's
//! is removed.

use byo_core::prepare::Check;

use super::StepDef;
use super::shared::{SPARK, file_is, verdict};
use crate::host::{self, Fallible, Host, apt_install, must, read_string, unit_active, user_exists};
use crate::prepare::Plan;

pub(crate) const SUDOERS: &str = "/etc/sudoers.d/enverge-spark";

const SUDOERS_LINE: &str = "spark ALL=(ALL) NOPASSWD:ALL\n";

const TUNNEL_TOKEN: &str = "/etc/enverge/tunnel-token";

pub(crate) const TUNNEL_UNIT: &str = byo_core::render::units::TUNNEL;

/// Written when operator-access creates spark (an account that was already there is the
/// owner's, and uninstall leaves it).
pub(crate) const SPARK_CREATED: &str = "/etc/enverge/spark-created";

/// The SHA-256 of the cloudflared build operator-access installed: uninstall removes the
/// binary only while it is still that build.
pub(crate) const CLOUDFLARED_INSTALLED: &str = "/etc/enverge/cloudflared-installed";

/// Where the pinned build is installed. Neither DGX OS nor Debian ships cloudflared, so
/// this, or Cloudflare's own package at /usr/bin, is the binary the unit runs.
pub const CLOUDFLARED_BIN: &str = "/usr/local/bin/cloudflared";

const CLOUDFLARED_CANDIDATES: &[&str] = &[CLOUDFLARED_BIN, "/usr/bin/cloudflared"];

/// Where the build lands before its digest is checked; removed either way.
const CLOUDFLARED_DOWNLOAD: &str = "/var/lib/enverge-agent/cloudflared.download";

/// The operator tunnel's unit, running the connector at `bin`.
pub fn tunnel_unit(bin: &str) -> String {
    format!(
        "[Unit]\nDescription=Enverge operator tunnel (cloudflared)\nAfter=network-online.target\nWants=network-online.target\n\n[Service]\nExecStart={bin} tunnel --no-autoupdate run --token-file {TUNNEL_TOKEN}\nRestart=always\nRestartSec=5\n\n[Install]\nWantedBy=multi-user.target\n"
    )
}

/// The cloudflared this host already runs (ours first), if any answers `--version`.
fn cloudflared_path<H: Host>(h: &mut H) -> Fallible<Option<String>> {
    for bin in CLOUDFLARED_CANDIDATES {
        if h.run(&[bin, "--version"], None)?.ok() {
            return Ok(Some((*bin).to_owned()));
        }
    }
    Ok(None)
}

/// Fetch the build enrolment pinned, check its SHA-256 against the pinned digest, and only
/// then install it 0755 at [`CLOUDFLARED_BIN`]. A mismatch installs nothing.
fn install_cloudflared<H: Host>(h: &mut H, plan: &Plan) -> Fallible<String> {
    use sha2::{Digest, Sha256};
    let build = plan.cloudflared.as_ref().ok_or(
        "cloudflared (the operator tunnel) is not installed, and enrolment named no build to install \
         (the server pins one per arch: cloudflared-<arch> in its release_dir, [cloudflared.sha256])",
    )?;
    let dir = CLOUDFLARED_DOWNLOAD
        .rsplit_once('/')
        .map_or("/", |(d, _)| d);
    must(h, &["install", "-d", "-m", "0700", dir])?;
    let fetched = must(
        h,
        &[
            "curl",
            "-fsSL",
            "--retry",
            "3",
            "--connect-timeout",
            "10",
            "-o",
            CLOUDFLARED_DOWNLOAD,
            &build.url,
        ],
    )
    .map_err(|e| format!("cloudflared (the operator tunnel) could not be fetched: {e}"))
    .and_then(|_| {
        h.read(CLOUDFLARED_DOWNLOAD)?
            .ok_or_else(|| format!("curl left no {CLOUDFLARED_DOWNLOAD}"))
    });
    h.remove(CLOUDFLARED_DOWNLOAD)?;
    let bytes = fetched?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if !actual.eq_ignore_ascii_case(build.sha256.trim()) {
        return Err(format!(
            "the cloudflared build from {} has SHA-256 {actual}, not the {} enrolment pinned; nothing was installed",
            build.url,
            build.sha256.trim()
        ));
    }
    // The record first: a run killed after the binary landed must still know it is ours.
    h.write(
        CLOUDFLARED_INSTALLED,
        format!("{actual}\n").as_bytes(),
        0o644,
        "root:root",
    )?;
    h.write(CLOUDFLARED_BIN, &bytes, 0o755, "root:root")?;
    Ok(CLOUDFLARED_BIN.to_owned())
}

pub(crate) struct OperatorAccess;

impl StepDef for OperatorAccess {
    const NAME: &str = "operator-access";

    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
        problems(h, plan).map(verdict)
    }

    fn apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
        let keys = plan.authorized_keys.clone().unwrap_or_default();
        if !user_exists(h, SPARK)? {
            // The record first: a run killed after useradd must still know spark is ours.
            h.write(SPARK_CREATED, b"spark\n", 0o644, "root:root")?;
            must(
                h,
                &[
                    "useradd",
                    "--create-home",
                    "--user-group",
                    "--shell",
                    "/bin/bash",
                    SPARK,
                ],
            )?;
        }
        // A sudoers file that does not parse breaks sudo for everyone: validate before it lands.
        let staging = format!("/etc/enverge/{}.check", "sudoers-spark");
        h.write(&staging, SUDOERS_LINE.as_bytes(), 0o440, "root:root")?;
        let valid = must(h, &["visudo", "-cf", &staging]);
        h.remove(&staging)?;
        valid?;
        h.write(SUDOERS, SUDOERS_LINE.as_bytes(), 0o440, "root:root")?;
        if !h
            .run(
                &[
                    "sshd",
                    "-T",
                    "-C",
                    "user=spark,host=localhost,addr=127.0.0.1",
                ],
                None,
            )?
            .ok()
        {
            apt_install(h, &["openssh-server"])?;
        }
        let ak = authorized_keys_path(h)?;
        let dir = ak.trim_end_matches("/authorized_keys").to_owned();
        must(
            h,
            &[
                "install", "-d", "-m", "0700", "-o", SPARK, "-g", SPARK, &dir,
            ],
        )?;
        h.write(&ak, keys.as_bytes(), 0o600, "spark:spark")?;
        for unit in ["ssh.service", "sshd.service"] {
            if h.run(&["systemctl", "enable", "--now", unit], None)?.ok() {
                break;
            }
        }
        if let Some(token) = &plan.tunnel_token {
            h.write(TUNNEL_TOKEN, token.as_bytes(), 0o600, "root:root")?;
            let bin = match cloudflared_path(h)? {
                Some(bin) => bin,
                None => install_cloudflared(h, plan)?,
            };
            h.write(
                &format!("/etc/systemd/system/{TUNNEL_UNIT}"),
                tunnel_unit(&bin).as_bytes(),
                0o644,
                "root:root",
            )?;
            must(h, &["systemctl", "daemon-reload"])?;
            must(h, &["systemctl", "enable", TUNNEL_UNIT])?;
            // A restart, so a unit rewritten for another binary runs that one.
            must(h, &["systemctl", "restart", TUNNEL_UNIT])?;
        }
        Ok(())
    }
}

fn authorized_keys_path<H: Host>(h: &mut H) -> Fallible<String> {
    let home = host::home_of(h, SPARK)?.unwrap_or_else(|| format!("/home/{SPARK}"));
    Ok(format!("{home}/.ssh/authorized_keys"))
}

/// Proof that operators can administer this host: spark exists, sudo works for it without
/// a password, sshd accepts its keys, and its authorized_keys holds the operator list.
pub(super) fn problems<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Vec<String>> {
    let keys = plan.authorized_keys.as_deref().ok_or(
        "no operator-key list is kept on this host (enrolment delivers it): nobody could administer it",
    )?;
    let mut needs = Vec::new();
    if !user_exists(h, SPARK)? {
        needs.push("create the spark user".to_owned());
        return Ok(needs);
    }
    if !file_is(h, SUDOERS, SUDOERS_LINE)? {
        needs.push(format!("write {SUDOERS}"));
    } else if !h
        .run(&["runuser", "-u", SPARK, "--", "sudo", "-n", "true"], None)?
        .ok()
    {
        needs.push("spark cannot sudo without a password".to_owned());
    }
    let ak = authorized_keys_path(h)?;
    if read_string(h, &ak)?.as_deref() != Some(keys) {
        needs.push(format!("write the operator keys to {ak}"));
    }
    let sshd = h.run(
        &[
            "sshd",
            "-T",
            "-C",
            "user=spark,host=localhost,addr=127.0.0.1",
        ],
        None,
    )?;
    if !sshd.ok() {
        needs.push("install and configure openssh-server".to_owned());
    } else {
        let conf = sshd.stdout.to_ascii_lowercase();
        if !conf.lines().any(|l| l.trim() == "pubkeyauthentication yes") {
            needs.push("sshd does not accept public keys".to_owned());
        }
        if let Some(allowed) = conf.lines().find(|l| l.starts_with("allowusers "))
            && !allowed.split_whitespace().skip(1).any(|u| u == SPARK)
        {
            needs.push(format!("sshd admits only {allowed}"));
        }
        if !(unit_active(h, "ssh.service")? || unit_active(h, "sshd.service")?) {
            needs.push("start sshd".to_owned());
        }
    }
    if let Some(token) = &plan.tunnel_token {
        if read_string(h, TUNNEL_TOKEN)?.as_deref() != Some(token.as_str()) {
            needs.push("keep the tunnel connector token".to_owned());
        }
        match cloudflared_path(h)? {
            None => needs.push("install cloudflared (the operator tunnel)".to_owned()),
            Some(bin) => {
                let unit = format!("/etc/systemd/system/{TUNNEL_UNIT}");
                if !file_is(h, &unit, &tunnel_unit(&bin))? {
                    needs.push(format!("write {unit} to run {bin}"));
                } else if !unit_active(h, TUNNEL_UNIT)? {
                    needs.push("run cloudflared (the operator tunnel)".to_owned());
                }
            }
        }
    }
    Ok(needs)
}
