//! `byo fleet upgrade --build X` (issue #14, 5; J note 9): every BYO host to one published
//! build, in waves, over the operators' access path (I), from the operator's machine.
//!
//! The server plans and records the run (`/api/admin/fleet-upgrades`): which hosts, which
//! wave, which are skipped (mid-create, de-pooled) and why. For each host of a wave this
//! command runs the host's own verifier — `sudo /usr/local/bin/byo-agent upgrade --build B`
//! — as `spark` with the operator's own key (spark's sudo is NOPASSWD, operator-access):
//! the agent already installed fetches the build, verifies it against the release key
//! pinned on the host and installs it; no script from the server runs (issue #36, 2: a
//! compromised server must not own every host at the next upgrade). Then it waits until the
//! server says the host's heartbeat reports the build, healthy; the next wave starts only then. The first
//! failure halts the run with its reason; `--resume` picks it up again (the failed host is
//! tried again, healthy ones are not touched). A server never holds an operator's key, which
//! is why the SSH runs here.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use byo_wire::fleet::{FleetAdvance, FleetNext, FleetReport, FleetRunView, FleetStart};
use byo_wire::states::FleetHostState;

use crate::host_ssh::{self, ACCOUNT, shell_line};
use crate::release::{refusal, signed_in};

/// How `byo fleet upgrade` reaches each host's sshd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Via {
    /// The operator tunnel: `cloudflared access ssh` to the host's tunnel hostname.
    Tunnel,
    /// Through the host's relay (IAP, WireGuard): break glass, as `byo host ssh --via relay`.
    Relay,
    /// Plain `ssh <slug>`: your ssh config says how to reach each host (HostName, Port,
    /// User spark, IdentityFile).
    SshConfig,
}

#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Upgrades every prepared BYO host to one published build, in waves: a canary first, then
cohorts doubling (--canary, --growth). On each host it runs, as spark with your operator key:

  sudo /usr/local/bin/byo-agent upgrade --build <build>

The agent already on the host fetches the build from its server, verifies its signature
against the release key pinned on the host (never one the server names), checks it is the
build named and that it runs, and only then installs it, detached; no script from the server
runs. Then this command waits for the host's heartbeat to report the build, healthy, before
the next wave. Hosts with an
instance being created or deleted, and de-pooled hosts, are skipped with the reason. The first
failure halts the run and says why; fix it and run the same command with --resume (the failed
host is tried again; hosts already upgraded are not touched). /admin/releases shows the run,
and a superadmin can halt or close it there.

The run is refused, with nothing started, for a build nobody published, a build the installer
does not serve for some host's arch (publish it for that arch), while another run is open,
and for anyone but a superadmin.

Examples:
  byo fleet upgrade --server https://app.enverge.ai --email me@enverge.ai --build 3f2a9c1b7d4e
  byo fleet upgrade --build 3f2a9c1b7d4e --resume
  byo fleet upgrade --build 3f2a9c1b7d4e --via relay --project enverge-prod --zone europe-west4-a")]
pub struct UpgradeArgs {
    /// The control plane's URL; hosts fetch the build from the server they enrolled with.
    #[arg(long, env = "BYO_SERVER", default_value = "http://localhost:8080")]
    pub server: String,
    /// Your account (a superadmin). The password comes from BYO_PASSWORD or the terminal.
    #[arg(long, env = "BYO_EMAIL")]
    pub email: String,
    /// The published build: its sha256, or its first 12 hex digits or more.
    #[arg(long)]
    pub build: String,
    /// Resume the open run (halted by a failure or by hand) instead of starting one.
    #[arg(long)]
    pub resume: bool,
    /// How each host is reached.
    #[arg(long, value_enum, default_value = "tunnel")]
    pub via: Via,
    /// Your operator key's private half (ssh's -i); without it, ssh's own choice.
    #[arg(long, short = 'i')]
    pub identity: Option<PathBuf>,
    /// With --via ssh-config: the ssh config file (ssh's -F).
    #[arg(long)]
    pub ssh_config: Option<PathBuf>,
    /// With --via relay: the relays' Google Cloud project.
    #[arg(long, env = "BYO_GCP_PROJECT")]
    pub project: Option<String>,
    /// With --via relay: the relays' zone.
    #[arg(long, env = "BYO_GCP_ZONE")]
    pub zone: Option<String>,
    /// Hosts in the first wave.
    #[arg(long, default_value_t = 1)]
    pub canary: u32,
    /// Each wave is this many times the one before.
    #[arg(long, default_value_t = 2)]
    pub growth: u32,
    /// How long a host has to report the build healthy after its upgrade started.
    #[arg(long, default_value_t = 300)]
    pub wait_secs: u32,
}

/// The remote command: the host's own verifier, to the run's build (never a script fetched
/// from the server).
pub fn upgrade_command(build: &str) -> String {
    format!(
        "sudo {} upgrade --build {}",
        byo_core::render::units::AGENT_BIN,
        shell_line(&[build.to_owned()])
    )
}

/// The ssh argv that runs `command` on the host `slug` (tunnel hostname `tunnel`).
pub fn ssh_argv(
    args: &UpgradeArgs,
    slug: &str,
    tunnel: Option<&str>,
    command: &str,
) -> anyhow::Result<Vec<String>> {
    let batch = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=20"].map(String::from);
    let identity = |argv: &mut Vec<String>| {
        if let Some(i) = &args.identity {
            argv.extend([
                "-i".into(),
                i.to_string_lossy().into_owned(),
                "-o".into(),
                "IdentitiesOnly=yes".into(),
            ]);
        }
    };
    let mut argv: Vec<String> = vec!["ssh".into()];
    match args.via {
        Via::Relay => {
            let (Some(project), Some(zone)) = (&args.project, &args.zone) else {
                bail!("--via relay needs --project and --zone (the relays' project and zone)");
            };
            let relay = host_ssh::SshArgs {
                host: slug.to_owned(),
                via: host_ssh::Via::Relay,
                project: project.clone(),
                zone: zone.clone(),
                identity: args.identity.clone(),
                print: false,
                command: vec![command.to_owned()],
            };
            let mut a = host_ssh::relay_argv(&relay)?;
            a.splice(1..1, batch);
            return Ok(a);
        }
        Via::Tunnel => {
            let Some(tunnel) = tunnel else {
                bail!("no operator tunnel is recorded for {slug}: reach it --via relay");
            };
            argv.extend([
                "-o".into(),
                "ProxyCommand=cloudflared access ssh --hostname %h".into(),
                "-o".into(),
                format!("HostKeyAlias={slug}"),
            ]);
            argv.extend(batch);
            identity(&mut argv);
            argv.push(format!("{ACCOUNT}@{tunnel}"));
        }
        Via::SshConfig => {
            if let Some(f) = &args.ssh_config {
                argv.extend(["-F".into(), f.to_string_lossy().into_owned()]);
            }
            argv.extend(batch);
            identity(&mut argv);
            argv.push(slug.to_owned());
        }
    }
    argv.push("--".into());
    argv.push(command.to_owned());
    Ok(argv)
}

/// Run the upgrade command on one host: `Ok(seconds)` or the reason it failed (exit and the last
/// lines it printed).
fn run_upgrade(argv: &[String]) -> Result<f64, String> {
    let started = Instant::now();
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not run {}: {e}", argv[0]))?;
    if out.status.success() {
        return Ok(started.elapsed().as_secs_f64());
    }
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let tail: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = tail[tail.len().saturating_sub(3)..].join(" | ");
    let code = out
        .status
        .code()
        .map_or_else(|| "a signal".to_owned(), |c| c.to_string());
    let mut reason = format!("the upgrade exited {code}: {tail}");
    if out.status.code() == Some(255) {
        reason.push_str(
            " (ssh could not reach the host: is it on the network, is your key on the list?)",
        );
    }
    Err(reason.chars().take(1500).collect())
}

struct Driver {
    client: reqwest::Client,
    base: String,
}

impl Driver {
    async fn advance(
        &self,
        run_id: &str,
        report: Option<FleetReport>,
    ) -> anyhow::Result<FleetRunView> {
        let resp = self
            .client
            .post(format!(
                "{}/api/admin/fleet-upgrades/{run_id}/advance",
                self.base
            ))
            .json(&FleetAdvance { report })
            .send()
            .await
            .with_context(|| format!("reaching {}", self.base))?;
        if !resp.status().is_success() {
            return Err(refusal("the server refused the step", resp).await);
        }
        Ok(resp.json().await?)
    }
}

fn slug_of(run: &FleetRunView, id: &str) -> String {
    run.hosts
        .iter()
        .find(|h| h.host_id == id)
        .map_or_else(|| id.to_owned(), |h| h.slug.clone())
}

pub async fn upgrade(args: UpgradeArgs) -> anyhow::Result<()> {
    let base = args.server.trim_end_matches('/').to_owned();
    let client = signed_in(&base, &args.email).await?;
    let resp = client
        .post(format!("{base}/api/admin/fleet-upgrades"))
        .json(&FleetStart {
            build: args.build.clone(),
            resume: args.resume,
            canary: Some(args.canary),
            growth: Some(args.growth),
            wait_secs: Some(args.wait_secs),
        })
        .send()
        .await
        .with_context(|| format!("reaching {base}"))?;
    if !resp.status().is_success() {
        return Err(refusal("the fleet upgrade was refused", resp).await);
    }
    let mut run: FleetRunView = resp.json().await?;
    let command = upgrade_command(&run.build);
    let driver = Driver { client, base };
    let started = Instant::now();
    let waves = run.hosts.iter().map(|h| h.wave).max().unwrap_or(-1) + 1;
    println!(
        "fleet upgrade {} to build {}: {} host(s), {} wave(s){}",
        run.id,
        run.build,
        run.hosts.len(),
        waves,
        if args.resume { ", resumed" } else { "" }
    );
    println!("  on each: {command}");
    let mut printed: HashMap<String, FleetHostState> = HashMap::new();
    let mut upgrade_at: HashMap<String, Instant> = HashMap::new();
    let mut last_wait_line = Instant::now();
    loop {
        for h in &run.hosts {
            if printed.get(&h.host_id) == Some(&h.state) {
                continue;
            }
            printed.insert(h.host_id.clone(), h.state);
            let reason = h
                .reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            match h.state {
                FleetHostState::Healthy => {
                    let took = upgrade_at
                        .get(&h.host_id)
                        .map(|t| {
                            format!(
                                ", {:.1} s after its upgrade started",
                                t.elapsed().as_secs_f64()
                            )
                        })
                        .unwrap_or_default();
                    println!(
                        "  {}: healthy on build {}{took}{}",
                        h.slug,
                        run.build,
                        if took.is_empty() {
                            reason
                        } else {
                            String::new()
                        }
                    );
                }
                FleetHostState::Skipped => println!("  {}: skipped{reason}", h.slug),
                FleetHostState::Failed => println!("  {}: FAILED{reason}", h.slug),
                FleetHostState::Waiting | FleetHostState::Upgrading => {}
            }
        }
        match run.next.clone() {
            FleetNext::Done => {
                let count = |s: FleetHostState| run.hosts.iter().filter(|h| h.state == s).count();
                println!(
                    "fleet upgrade {} done in {:.1} s: {} healthy on build {}, {} skipped",
                    run.id,
                    started.elapsed().as_secs_f64(),
                    count(FleetHostState::Healthy),
                    run.build,
                    count(FleetHostState::Skipped)
                );
                return Ok(());
            }
            FleetNext::Halted { reason } => {
                bail!(
                    "fleet upgrade {} halted: {reason}\n  fix it, then: byo fleet upgrade --build {} --resume",
                    run.id,
                    run.build
                );
            }
            FleetNext::Upgrade { hosts } => {
                let wave = run
                    .hosts
                    .iter()
                    .find(|h| hosts.first() == Some(&h.host_id))
                    .map_or(0, |h| h.wave);
                let names: Vec<String> = hosts.iter().map(|id| slug_of(&run, id)).collect();
                println!("wave {wave}: upgrading {}", names.join(", "));
                let mut tasks = Vec::new();
                for id in &hosts {
                    let h = run
                        .hosts
                        .iter()
                        .find(|h| &h.host_id == id)
                        .cloned()
                        .context("the server named a host outside the run")?;
                    // Recorded before the upgrade starts, so a heartbeat it brings is judged.
                    run = driver
                        .advance(
                            &run.id,
                            Some(FleetReport {
                                host_id: id.clone(),
                                state: FleetHostState::Upgrading,
                                reason: None,
                            }),
                        )
                        .await?;
                    upgrade_at.insert(id.clone(), Instant::now());
                    let argv = ssh_argv(&args, &h.slug, h.tunnel_hostname.as_deref(), &command);
                    let slug = h.slug.clone();
                    let id = id.clone();
                    tasks.push(tokio::task::spawn_blocking(move || {
                        let outcome = argv
                            .map_err(|e| format!("{e:#}"))
                            .and_then(|a| run_upgrade(&a));
                        (id, slug, outcome)
                    }));
                }
                for task in tasks {
                    let (id, slug, outcome) = task.await?;
                    match outcome {
                        Ok(secs) => println!(
                            "  {slug}: upgrade done in {secs:.1} s; waiting for its heartbeat"
                        ),
                        Err(reason) => {
                            run = driver
                                .advance(
                                    &run.id,
                                    Some(FleetReport {
                                        host_id: id,
                                        state: FleetHostState::Failed,
                                        reason: Some(reason),
                                    }),
                                )
                                .await?;
                        }
                    }
                }
                run = driver.advance(&run.id, None).await?;
            }
            FleetNext::Wait { hosts } => {
                if last_wait_line.elapsed() >= Duration::from_secs(15) {
                    let names: Vec<String> = hosts.iter().map(|id| slug_of(&run, id)).collect();
                    println!("  waiting for the heartbeat of {}", names.join(", "));
                    last_wait_line = Instant::now();
                }
                // The heartbeat is the host's own schedule; the server judges each poll.
                tokio::time::sleep(Duration::from_millis(500)).await;
                run = driver.advance(&run.id, None).await?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(via: Via) -> UpgradeArgs {
        UpgradeArgs {
            server: "https://app.example.com/".into(),
            email: "me@example.com".into(),
            build: "0123456789ab".into(),
            resume: false,
            via,
            identity: Some("/home/op/.ssh/id_ed25519".into()),
            ssh_config: Some("/home/op/.ssh/fleet".into()),
            project: Some("enverge-prod".into()),
            zone: Some("europe-west4-a".into()),
            canary: 1,
            growth: 2,
            wait_secs: 300,
        }
    }

    #[test]
    fn the_hosts_own_verifier_runs_as_spark_over_each_access_path() {
        // Never a script from the server (issue #36, 2): the agent on the host verifies.
        let cmd = upgrade_command("0123456789ab");
        assert_eq!(
            cmd,
            "sudo /usr/local/bin/byo-agent upgrade --build 0123456789ab"
        );
        assert_eq!(
            upgrade_command("x; id"),
            "sudo /usr/local/bin/byo-agent upgrade --build 'x; id'"
        );
        let tunnel = ssh_argv(
            &args(Via::Tunnel),
            "spark-7",
            Some("spark-7.ssh.example.com"),
            &cmd,
        )
        .unwrap();
        assert_eq!(
            shell_line(&tunnel),
            "ssh -o 'ProxyCommand=cloudflared access ssh --hostname %h' -o HostKeyAlias=spark-7 -o BatchMode=yes -o ConnectTimeout=20 -i /home/op/.ssh/id_ed25519 -o IdentitiesOnly=yes spark@spark-7.ssh.example.com -- 'sudo /usr/local/bin/byo-agent upgrade --build 0123456789ab'"
        );
        let err = ssh_argv(&args(Via::Tunnel), "spark-7", None, &cmd).unwrap_err();
        assert!(err.to_string().contains("--via relay"), "{err}");
        let relay = shell_line(&ssh_argv(&args(Via::Relay), "spark-7", None, &cmd).unwrap());
        assert!(
            relay.starts_with("ssh -o BatchMode=yes -o ConnectTimeout=20 -o 'ProxyCommand=gcloud compute ssh spark-7-relay")
                && relay.ends_with("spark@10.8.0.2 -- 'sudo /usr/local/bin/byo-agent upgrade --build 0123456789ab'"),
            "{relay}"
        );
        let mut no_project = args(Via::Relay);
        no_project.project = None;
        assert!(ssh_argv(&no_project, "spark-7", None, &cmd).is_err());
        assert!(ssh_argv(&args(Via::Relay), "spark-7;id", None, &cmd).is_err());
        let config = shell_line(&ssh_argv(&args(Via::SshConfig), "spark-7", None, &cmd).unwrap());
        assert_eq!(
            config,
            "ssh -F /home/op/.ssh/fleet -o BatchMode=yes -o ConnectTimeout=20 -i /home/op/.ssh/id_ed25519 -o IdentitiesOnly=yes spark-7 -- 'sudo /usr/local/bin/byo-agent upgrade --build 0123456789ab'"
        );
    }
}
