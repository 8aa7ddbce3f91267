//! `byo-agent`: the host agent. This file parses the command line and dispatches; each
//! command's work is a function of the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use byo_agent::operator_keys::{self, OperatorKeys, Paths};
use byo_agent::serve::{self, ServeOptions};
use byo_agent::{enroll, machines, prepare, uninstall, upgrade};
use clap::{Args, Parser, Subcommand};

/// The byo host agent. It is installed by the one-liner from the owner's dashboard and
/// runs as three systemd units: enverge-agent-prepare (enrol and prepare, as root),
/// enverge-agent (serve, unprivileged) and enverge-agent-rollback.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the agent's API for the backend (the enverge-agent unit, as spark): at start
    /// it asks root to bring authorized_keys to the kept operator-key list, then answers
    /// pushes (each passed to root's enverge-operator-keys, which applies it).
    Serve {
        /// Where the relay's Caddy reaches the agent (wg0's host address).
        #[arg(long, default_value = "10.8.0.2:8080")]
        listen: std::net::SocketAddr,
        /// The SHA-256 (hex) of the agent token the backend presents.
        #[arg(long, default_value = "/etc/enverge/agent-token.sha256")]
        agent_token_hash: PathBuf,
        /// What preparation handed over; without it the VM API answers 503.
        #[arg(long, default_value = machines::HANDED_OVER)]
        serving_file: PathBuf,
        /// Seconds between heartbeats (the relay map is re-asserted at each).
        #[arg(long, default_value_t = 30)]
        heartbeat_every: u64,
        #[command(flatten)]
        paths: KeyPaths,
        /// The listener's header, idle, body and connection limits (#16).
        #[command(flatten)]
        limits: byo_listen::Limits,
    },
    /// Enrol this machine (step 126): detect it, redeem the token, keep the credentials
    /// root-only under /etc/enverge. A machine that already enrolled reuses them. The token
    /// comes from --token, --token-file, or standard input. On a pair or ring (install.sh
    /// --peer --nodes=N wrote /etc/enverge/peer-nodes) the cable probe (step 125, see
    /// probe-cables) runs first and its rails and peers are the evidence sent. Exit status:
    /// 0 enrolled (or already), 3 the server refused the token (unknown, spent or expired),
    /// 4 the token is malformed (refused here, nothing sent), 5 the server turned this
    /// machine away, 6 the server could not be reached, 9 the other machines were not
    /// found while the token lived (nothing sent), 1 anything else.
    Enroll {
        /// The control plane, e.g. https://app.enverge.ai.
        #[arg(long, env = "BYO_SERVER")]
        server: String,
        #[arg(long, conflicts_with = "token_file")]
        token: Option<String>,
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Where /etc/enverge and /var/lib/enverge-agent live (tests use a directory).
        #[arg(long, default_value = "/")]
        root: PathBuf,
        /// Seconds between attempts while the server cannot be reached.
        #[arg(long, default_value_t = 60)]
        retry_every: u64,
        /// Seconds to keep trying an unreachable server (the default: the token's lifetime).
        #[arg(long, default_value_t = 3600)]
        give_up_after: u64,
        /// On a pair or ring: seconds between cable probes (step 125) while node1 cannot be
        /// reached or its login is refused. Nothing is sent meanwhile; the token stays unspent.
        #[arg(long, default_value_t = 60)]
        probe_every: u64,
        /// On a pair or ring: seconds to keep probing (the default: the token's lifetime).
        /// Exit status 9 when no pair was found by then.
        #[arg(long, default_value_t = 3600)]
        probe_for: u64,
    },
    /// Step 125 once, as enrolment runs it on a pair or ring (as root, on node0): each rail
    /// port brought up with link-local eui64 pinned (the one pre-enrol write, on node0 and,
    /// after a login, on the machine behind the cable), the all-nodes multicast on each, a
    /// login at each address that answered (the peer user's keys, then the password in
    /// /etc/enverge/peer-login), and what each port is: a cable to one machine, a LAN, a
    /// login failure, a loop back to this machine, silence. When a pair would enrol, the
    /// numbered links are recorded in /etc/enverge/peer.json. Prints JSON; sends nothing
    /// to the backend. Exit status 0 when the pair would enrol, 9 when enrolment would wait.
    ProbeCables {
        #[arg(long, default_value = "/")]
        root: PathBuf,
    },
    /// What enverge-agent-prepare runs, as root: enrol with the token the installer left
    /// (once), then prepare the host. A completed preparation is recorded, and later starts
    /// find the record and exit at once (L, rule 1).
    Prepare {
        #[arg(long, default_value = "/")]
        root: PathBuf,
        /// Only check: report what each step would change, and change nothing.
        #[arg(long, conflicts_with = "again")]
        dry_run: bool,
        /// Prepare again, deliberately (L, "Host configuration after go-live"): what an
        /// operator runs as root over the operator tunnel when a newer agent changes what a
        /// step does. Every step is checked again whatever the done list says, and each is
        /// reported to /admin as usual; serving is not restarted.
        ///
        /// Refused, with the reason and nothing changed, when this host has not completed
        /// preparation (exit 4), while an instance of ours is running — an instance holds
        /// the rails (exit 3) — while the VM API is creating or starting one or another run
        /// holds /var/lib/enverge-agent/prepare.lock (exit 5), or when LXD does not answer
        /// (exit 6). While it runs, the VM API refuses creates and starts (host_preparing,
        /// which the backend takes as no capacity). A step that fails is reported, on
        /// /admin's host page as "re-prepare failed at <step>", and left: nothing is rolled
        /// back (exit 1).
        #[arg(long)]
        again: bool,
    },
    /// Bring the tenant firewall to what this host is now (as root; what
    /// enverge-tenant-firewall-refresh.service runs when serving asks, after a heartbeat
    /// found the host's networks or the owner's public address changed). The firewall
    /// step's own render, check and load: the table is reloaded only when it differs.
    /// Does nothing before preparation has completed.
    FirewallRefresh {
        #[arg(long, default_value = "/")]
        root: PathBuf,
    },
    /// Answer serving's LXD calls as root, forwarding only what serving may do (the
    /// enverge-lxd-gate unit; serving is not in LXD's group). Everything else is refused
    /// with 403 before LXD sees it, and logged.
    LxdGate {
        /// Where serving reaches the gate (made 0660, the process's group).
        #[arg(long, default_value = byo_agent::names::LXD_GATE_SOCKET)]
        socket: PathBuf,
        /// Preparation's hand-over: the tunnel address an instance's SSH is published on.
        #[arg(long, default_value = machines::HANDED_OVER)]
        serving_file: PathBuf,
    },
    /// The signed operator-key list: what lets operators log in as spark.
    #[command(subcommand)]
    OperatorKeys(KeysCommand),
    /// Upgrade this machine's agent to the build its server serves, verified here (as root;
    /// what `byo fleet upgrade` runs over ssh).
    ///
    /// The build and its signature are fetched from the server this machine enrolled with
    /// (/etc/enverge/server); the signature must be the release key's — the one pinned on
    /// this machine (/etc/enverge/release-key), whatever the server names — and, with
    /// --build, the build must be that one. The build must run here (--version). Only then
    /// is it installed, detached as the transient unit enverge-agent-install so a dropped
    /// SSH session cannot cut it short: the running build kept as byo-agent.previous, the
    /// new build's own units and rollback script written, serving restarted (or, before
    /// preparation has handed over, preparation started). No script from the server runs.
    ///
    /// Exit status: 0 upgraded (or already on the build), 6 the server could not be
    /// reached, 7 it serves no build for this arch, 8 the build is not signed by the pinned
    /// release key (or none is pinned, or no signature is served), 10 it serves another
    /// build than --build, 1 anything else (not root, not enrolled, a build that does not
    /// run here, the detached install failed). Nothing is installed on any refusal.
    Upgrade {
        /// The build expected: 12 to 64 hex digits of its sha256 (what /admin/releases and
        /// `byo release publish` name it by).
        #[arg(long)]
        build: Option<String>,
    },
    /// Print the script that installs this build (its units and rollback script), which
    /// `upgrade` runs detached once this build is verified; install.sh carries the same.
    #[command(hide = true)]
    FinishScript,
    /// Hand this machine back to its owner (as root, on node0; `install.sh --uninstall`
    /// runs it).
    ///
    /// First the owner's access is restored and proved: the sshd drop-in that admits only
    /// spark is removed, the owner's password unlocked and their admin groups given back,
    /// then sshd's effective configuration (`sshd -T`) must accept their password, their
    /// shell must be a login shell and /etc/shadow must hold a usable password. If that
    /// proof fails, nothing of byo's is removed (exit 3).
    ///
    /// Only then, in this order: the agent's units (enverge-agent, -prepare, -rollback);
    /// on a pair's or a ring's node0, each satellite, reached over the management network
    /// as spark with node0's peer key (its owner restored and proved first, then what
    /// preparation put there, spark's access last); our LXD instances (on lofispark-base) and the lofispark-base profile; LXD itself
    /// with its images, pool and bridge, when preparation installed it (unless
    /// --keep-lxd); the tenant firewall (its unit, nftables' inet enverge_tenants, our
    /// ufw rules); the relay peer (wg-quick@wg0, /etc/wireguard/wg0.conf); the operator
    /// tunnel (enverge-tunnel, the cloudflared build we installed); spark's access (its
    /// sudoers drop-in, authorized_keys, and the spark user if we created it); our host
    /// settings (the ZFS ARC cap, the watchdog drop-in, fstab's swap lines given back and the
    /// swap preparation turned off turned on); Docker, when asked (--restore-docker); and
    /// last /var/lib/enverge-agent, /etc/enverge and the agent's binary. ufw's
    /// DEFAULT_FORWARD_POLICY goes back to what it was before preparation set ACCEPT.
    ///
    /// Kept: Docker unless --restore-docker (the run names what was removed and how to
    /// have it back), packages preparation installed (earlyoom, wireguard-tools, nftables),
    /// and an LXD or a spark account that were already here.
    ///
    /// Each step checks before it removes and checks again after, so an uninstall cut
    /// short finishes when run again, and one on a machine with nothing of ours says so
    /// and exits 0. Exit status: 0 uninstalled (or nothing to do), 1 a removal step failed
    /// (what came before it is gone; run again), 3 the owner's access could not be restored
    /// and verified (nothing removed), 4 refused to start (not root, or not confirmed).
    Uninstall {
        /// Keep LXD and its images (our instances and profile still go).
        #[arg(long)]
        keep_lxd: bool,
        /// Reinstall the Docker packages preparation purged (recorded when it purged them).
        #[arg(long)]
        restore_docker: bool,
        /// On a pair's or a ring's node0: hand this machine back alone and leave the
        /// satellites prepared (one that is switched off for good). Without it each satellite
        /// is handed back first, from here, over the management network.
        #[arg(long)]
        leave_satellites: bool,
        /// Go ahead without asking.
        #[arg(long)]
        yes: bool,
        /// The login that administers this machine afterwards (default: the one install.sh
        /// recorded in /etc/enverge/owner, else whoever ran this through sudo).
        #[arg(long)]
        owner: Option<String>,
    },
}

#[derive(Args)]
struct KeyPaths {
    /// The pinned signing key(s), one OpenSSH public key per line.
    #[arg(long, default_value = "/etc/enverge/signing-keys")]
    trusted: PathBuf,
    /// Where root keeps the signed list (preparation reads it too; serving only reads it).
    #[arg(long, default_value = byo_core::render::units::OPERATOR_KEYS_HELD)]
    held: PathBuf,
    /// spark's authorized_keys.
    #[arg(long, default_value = "/home/spark/.ssh/authorized_keys")]
    authorized_keys: PathBuf,
    /// Where enrolment kept the environment this host enrolled into; a list for another
    /// is refused.
    #[arg(long, default_value = enroll::ENVIRONMENT_FILE)]
    environment_file: PathBuf,
    /// Where serving passes a pushed list to root (enverge-operator-keys.path watches it).
    #[arg(long, default_value = byo_core::render::units::OPERATOR_KEYS_FLAG)]
    request: PathBuf,
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Verify a signed list (a file, or - for standard input) and apply it.
    Apply {
        file: PathBuf,
        #[command(flatten)]
        paths: KeyPaths,
    },
    /// Take what serving passed on (as root: the enverge-operator-keys unit): a pushed
    /// list verified against this host's trust and kept list and applied, then
    /// authorized_keys brought to the kept list at this moment (break glass past expiry).
    ApplyRequested {
        #[command(flatten)]
        paths: KeyPaths,
    },
    /// Rewrite authorized_keys from the kept list if they differ.
    Reconcile {
        #[command(flatten)]
        paths: KeyPaths,
    },
    /// Pin the signing key on a host that trusts none (an operator, as root, over the tunnel).
    Trust {
        /// The signing key's OpenSSH public key ("ssh-ed25519 AAAA…").
        key: String,
        #[command(flatten)]
        paths: KeyPaths,
    },
    /// Show the kept list: its version, expiry and every key with its fingerprint.
    Show {
        #[command(flatten)]
        paths: KeyPaths,
    },
}

fn keys(paths: KeyPaths) -> anyhow::Result<OperatorKeys> {
    let environment = enroll::enrolled_environment(&paths.environment_file, &paths.held)?
        .unwrap_or_else(|| {
            eprintln!(
                "byo-agent: {} is missing and no list is held: this host does not know its environment, and refuses every list",
                paths.environment_file.display()
            );
            String::new()
        });
    // The host's slug, for break glass at expiry, from what preparation handed serving
    // (readable by spark and root alike); serve reads its own --serving-file.
    let host = std::fs::read(machines::HANDED_OVER)
        .ok()
        .and_then(|b| serde_json::from_slice::<machines::HandOver>(&b).ok())
        .map(|h| h.slug);
    Ok(OperatorKeys {
        paths: Paths {
            trusted: paths.trusted,
            held: paths.held,
            authorized_keys: paths.authorized_keys,
            request: paths.request,
        },
        environment,
        host,
    })
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            listen,
            agent_token_hash,
            serving_file,
            heartbeat_every,
            paths,
            limits,
        } => serve::run(ServeOptions {
            listen,
            agent_token_hash,
            serving_file,
            heartbeat_every,
            operator_keys: keys(paths)?,
            limits,
        }),
        Command::Enroll {
            server,
            token,
            token_file,
            root,
            retry_every,
            give_up_after,
            probe_every,
            probe_for,
        } => enroll::run(
            &server,
            token,
            token_file,
            root,
            enroll::Patience {
                retry_every: Duration::from_secs(retry_every),
                give_up_after: Duration::from_secs(give_up_after),
                probe_every: Duration::from_secs(probe_every),
                probe_for: Duration::from_secs(probe_for),
            },
        ),
        Command::ProbeCables { root } => enroll::probe_command(&root),
        Command::Prepare {
            root,
            dry_run: _,
            again: true,
        } => prepare::unit::run_again(&root),
        Command::Prepare { root, dry_run, .. } => prepare::unit::run(&root, dry_run),
        Command::FirewallRefresh { root } => prepare::unit::refresh_firewall(&root),
        Command::LxdGate {
            socket,
            serving_file,
        } => byo_agent::lxd_gate::run(&socket, &serving_file),
        Command::OperatorKeys(cmd) => match cmd {
            KeysCommand::Apply { file, paths } => {
                operator_keys::apply_command(&keys(paths)?, &file)
            }
            KeysCommand::Reconcile { paths } => operator_keys::reconcile_command(&keys(paths)?),
            KeysCommand::ApplyRequested { paths } => {
                operator_keys::apply_requested_command(&keys(paths)?)
            }
            KeysCommand::Trust { key, paths } => operator_keys::trust_command(&keys(paths)?, &key),
            KeysCommand::Show { paths } => operator_keys::show_command(&keys(paths)?),
        },
        Command::Uninstall {
            keep_lxd,
            restore_docker,
            leave_satellites,
            yes,
            owner,
        } => uninstall::run(keep_lxd, restore_docker, leave_satellites, yes, owner)
            .map_err(anyhow::Error::from),
        Command::Upgrade { build } => upgrade::run(build.as_deref()).map_err(anyhow::Error::from),
        Command::FinishScript => {
            use byo_core::render::units;
            print!("{}", units::finish_script(units::AGENT_BIN));
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    // Started by ssh as its askpass program, for a login the owner lent for a satellite.
    if let Some(file) = std::env::var_os(byo_agent::host::ASKPASS_ENV) {
        return match byo_agent::host::lent_password(std::path::Path::new(&file)) {
            Ok(p) => {
                println!("{p}");
                ExitCode::SUCCESS
            }
            Err(_) => ExitCode::FAILURE,
        };
    }
    let cli = Cli::parse();
    let enrolling = matches!(
        cli.command,
        Command::Enroll { .. } | Command::ProbeCables { .. }
    );
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("byo-agent: {e:#}");
            // enroll's refusals have their own statuses, which install.sh passes on.
            if let Some(stopped) = e.downcast_ref::<uninstall::UninstallError>() {
                return ExitCode::from(stopped.exit_code());
            }
            if let Some(refused) = e.downcast_ref::<upgrade::UpgradeError>() {
                return ExitCode::from(refused.exit_code());
            }
            if let Some(again) = e.downcast_ref::<prepare::again::AgainError>() {
                return ExitCode::from(again.exit_code());
            }
            match e.downcast_ref::<enroll::EnrollError>() {
                Some(refusal) if enrolling => ExitCode::from(refusal.exit_code()),
                _ => ExitCode::FAILURE,
            }
        }
    }
}
