//! `byo host ssh <host> --via relay`: break glass through the relay (I, "Why there are two").
//!
//! The operator tunnel rides cloudflared and can vanish with Cloudflare, the host's uplink or
//! one systemd unit. The relay is ours: IAP reaches it whatever the host is doing, and
//! WireGuard puts it one hop from the host (10.8.0.2). The relay's LOFISPARK_VMSSH chain is on
//! PREROUTING, so a connection the relay itself opens is never DNATed into the customer's
//! container: `ssh spark@10.8.0.2` from the relay lands on the host's own sshd.
//!
//! The command is one `ssh` on the operator's machine whose ProxyCommand is
//! `gcloud compute ssh <slug>-relay --tunnel-through-iap -- -W 10.8.0.2:22`: the relay only
//! carries bytes, the operator's key never leaves their machine (no agent forwarding), and the
//! host authenticates them by the signed list's key like any other login (so the login is
//! attributed on the owner's page). The host's key is remembered under the host's slug, not
//! under 10.8.0.2, which every host shares.

use std::process::Command;

use anyhow::{Context, bail};

/// The host's address at the far end of its relay's WireGuard tunnel.
pub const HOST_TUNNEL_ADDRESS: &str = "10.8.0.2";
/// The account every operator logs in to.
pub const ACCOUNT: &str = "spark";

/// `byo host ssh`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
When the operator tunnel is down (cloudflared stopped, Cloudflare or the host's uplink out),
the relay still reaches the host: it is a VM in our project that IAP reaches whatever the
host is doing, one WireGuard hop from it. This command runs, on your machine:

  ssh -o ProxyCommand='gcloud compute ssh spark-7-relay --project=P --zone=Z \\
        --tunnel-through-iap --quiet -- -W 10.8.0.2:22' \\
      -o HostKeyAlias=spark-7 spark@10.8.0.2

Your operator key stays on your machine; the host accepts it only while the signed
operator-key list it holds names it, and the owner sees the login on their page.
You need gcloud signed in with IAP-tunnel access to the project's relays.
If the relay path fails too, the host is off the network: de-pool and revoke.

Examples:
  byo host ssh spark-7 --via relay --project enverge-prod --zone europe-west4-a
  byo host ssh spark-7 --via relay --print      # show the command, run nothing
  byo host ssh spark-7 --via relay -- sudo systemctl status cloudflared")]
pub struct SshArgs {
    /// The host's slug, as /admin/hosts shows it (spark-7).
    pub host: String,
    /// The path in: `relay` (through the host's relay, over IAP and WireGuard).
    #[arg(long, value_enum)]
    pub via: Via,
    /// The Google Cloud project the relays live in.
    #[arg(long, env = "BYO_GCP_PROJECT")]
    pub project: String,
    /// The relays' zone.
    #[arg(long, env = "BYO_GCP_ZONE")]
    pub zone: String,
    /// Your operator key's private half (ssh's -i); without it, ssh's own choice.
    #[arg(long, short = 'i')]
    pub identity: Option<std::path::PathBuf>,
    /// Print the command instead of running it.
    #[arg(long)]
    pub print: bool,
    /// A command to run on the host instead of a shell.
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Via {
    /// Through the host's relay: IAP to the relay, WireGuard to the host.
    Relay,
}

/// A name gcloud and ssh take as one word: lower-case letters, digits and dashes.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
}

/// The `ssh` argv that reaches `args.host`'s sshd through its relay.
pub fn relay_argv(args: &SshArgs) -> anyhow::Result<Vec<String>> {
    for (what, value) in [
        ("host", &args.host),
        ("project", &args.project),
        ("zone", &args.zone),
    ] {
        if !is_name(value) {
            bail!("{what} {value:?} is not a name (lower-case letters, digits and dashes)");
        }
    }
    let proxy = format!(
        "ProxyCommand=gcloud compute ssh {host}-relay --project={project} --zone={zone} --tunnel-through-iap --quiet -- -W {HOST_TUNNEL_ADDRESS}:22",
        host = args.host,
        project = args.project,
        zone = args.zone,
    );
    let mut argv: Vec<String> = vec![
        "ssh".into(),
        "-o".into(),
        proxy,
        "-o".into(),
        format!("HostKeyAlias={}", args.host),
    ];
    if let Some(i) = &args.identity {
        argv.push("-i".into());
        argv.push(i.to_string_lossy().into_owned());
        argv.push("-o".into());
        argv.push("IdentitiesOnly=yes".into());
    }
    argv.push(format!("{ACCOUNT}@{HOST_TUNNEL_ADDRESS}"));
    if !args.command.is_empty() {
        argv.push("--".into());
        argv.extend(args.command.iter().cloned());
    }
    Ok(argv)
}

/// One argv as a shell line, each word quoted where it needs it.
pub fn shell_line(argv: &[String]) -> String {
    argv.iter()
        .map(|w| {
            if !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@,+%".contains(&b))
            {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Print the command, and run it unless `--print`.
pub fn run(args: SshArgs) -> anyhow::Result<()> {
    let argv = match args.via {
        Via::Relay => relay_argv(&args)?,
    };
    if args.print {
        println!("{}", shell_line(&argv));
        return Ok(());
    }
    eprintln!("byo: {}", shell_line(&argv));
    let status = Command::new(&argv[0])
        .args(&argv[1..])
        .status()
        .with_context(|| format!("running {}", argv[0]))?;
    if !status.success() {
        bail!(
            "ssh exited {status}: if the relay answered but the host did not, the host's WireGuard is down — it is off the network"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(host: &str) -> SshArgs {
        SshArgs {
            host: host.into(),
            via: Via::Relay,
            project: "enverge-prod".into(),
            zone: "europe-west4-a".into(),
            identity: None,
            print: true,
            command: vec![],
        }
    }

    #[test]
    fn the_relay_path_is_one_ssh_through_iap_to_the_hosts_tunnel_address() {
        let argv = relay_argv(&args("spark-7")).unwrap();
        assert_eq!(
            shell_line(&argv),
            "ssh -o 'ProxyCommand=gcloud compute ssh spark-7-relay --project=enverge-prod --zone=europe-west4-a --tunnel-through-iap --quiet -- -W 10.8.0.2:22' -o HostKeyAlias=spark-7 spark@10.8.0.2"
        );
        let mut with = args("spark-7");
        with.identity = Some("/home/op/.ssh/id_ed25519".into());
        with.command = vec![
            "sudo".into(),
            "systemctl".into(),
            "restart".into(),
            "it's".into(),
        ];
        let line = shell_line(&relay_argv(&with).unwrap());
        assert!(
            line.ends_with(
                "-i /home/op/.ssh/id_ed25519 -o IdentitiesOnly=yes spark@10.8.0.2 -- sudo systemctl restart 'it'\\''s'"
            ),
            "{line}"
        );
    }

    #[test]
    fn names_that_could_carry_options_or_shell_are_refused() {
        for bad in [
            "",
            "Spark-7",
            "spark 7",
            "spark-7;id",
            "-oProxyCommand=x",
            &"a".repeat(64),
        ] {
            assert!(relay_argv(&args(bad)).is_err(), "{bad:?}");
        }
        let mut a = args("spark-7");
        a.project = "p$(id)".into();
        assert!(relay_argv(&a).is_err());
        let mut a = args("spark-7");
        a.zone = "z one".into();
        assert!(relay_argv(&a).is_err());
        assert!(relay_argv(&args(&"a".repeat(63))).is_ok());
    }
}
