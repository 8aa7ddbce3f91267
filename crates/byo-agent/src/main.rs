//! `byo-agent`: the host agent.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use byo_agent::operator_keys::{OperatorKeys, Paths};
use byo_core::keylist::{check_key, escape_control};
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
    /// it brings authorized_keys to the kept operator-key list, then answers pushes.
    Serve {
        /// Where the relay's Caddy reaches the agent (wg0's host address).
        #[arg(long, default_value = "10.8.0.2:8080")]
        listen: std::net::SocketAddr,
        /// The SHA-256 (hex) of the agent token the backend presents.
        #[arg(long, default_value = "/etc/enverge/agent-token.sha256")]
        agent_token_hash: PathBuf,
        /// What preparation handed over; without it the VM API answers 503.
        #[arg(long, default_value = byo_agent::prepare::HANDED_OVER)]
        serving_file: PathBuf,
        /// Seconds between heartbeats (the relay map is re-asserted at each).
        #[arg(long, default_value_t = 30)]
        heartbeat_every: u64,
        #[command(flatten)]
        paths: KeyPaths,
    },
    /// Enrol this machine (step 126): detect it, redeem the token, keep the credentials
    /// root-only under /etc/enverge. A machine that already enrolled reuses them. The token
    /// comes from --token, --token-file, or standard input.
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
    },
    /// What enverge-agent-prepare runs, as root: enrol with the token the installer left
    /// (once), then prepare the host. A completed preparation is recorded, and later starts
    /// find the record and exit at once (L, rule 1).
    Prepare {
        #[arg(long, default_value = "/")]
        root: PathBuf,
        /// Only check: report what each step would change, and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// What enverge-agent-rollback runs when serving will not stay up: go back to
    /// byo-agent.previous once, and never to the build already running (L1).
    Rollback {
        #[arg(long, default_value = "/usr/local/bin/byo-agent")]
        bin: PathBuf,
    },
    /// The signed operator-key list: what lets operators log in as spark.
    #[command(subcommand)]
    OperatorKeys(KeysCommand),
}

#[derive(Args)]
struct KeyPaths {
    /// The pinned signing key(s), one OpenSSH public key per line.
    #[arg(long, default_value = "/etc/enverge/signing-keys")]
    trusted: PathBuf,
    /// Where the signed list is kept (preparation reads it too).
    #[arg(long, default_value = "/var/lib/enverge-agent/operator-keys.signed")]
    held: PathBuf,
    /// spark's authorized_keys.
    #[arg(long, default_value = "/home/spark/.ssh/authorized_keys")]
    authorized_keys: PathBuf,
    /// This installation's environment id; a list for another is refused.
    #[arg(long, env = "BYO_ENVIRONMENT", default_value = "production")]
    environment: String,
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Verify a signed list (a file, or - for standard input) and apply it.
    Apply {
        file: PathBuf,
        #[command(flatten)]
        paths: KeyPaths,
    },
    /// Rewrite authorized_keys from the kept list if they differ (run at start).
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

fn keys(paths: KeyPaths) -> OperatorKeys {
    OperatorKeys {
        paths: Paths {
            trusted: paths.trusted,
            held: paths.held,
            authorized_keys: paths.authorized_keys,
        },
        environment: paths.environment,
    }
}

fn serve(
    listen: std::net::SocketAddr,
    token_hash_file: PathBuf,
    serving_file: PathBuf,
    heartbeat_every: u64,
    paths: KeyPaths,
) -> anyhow::Result<()> {
    let heartbeat_every = std::time::Duration::from_secs(heartbeat_every.max(1));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .compact()
        .init();
    let hash = std::fs::read_to_string(&token_hash_file)
        .with_context(|| format!("reading {}", token_hash_file.display()))?;
    let hash = hash.trim();
    anyhow::ensure!(
        hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{} must hold a SHA-256 in hex",
        token_hash_file.display()
    );
    let operator_keys = keys(paths);
    if operator_keys.reconcile()? {
        tracing::info!("authorized_keys brought to the kept operator-key list");
    }
    let vms = match std::fs::read(&serving_file) {
        Ok(bytes) => {
            let handed: byo_agent::prepare::Serving = serde_json::from_slice(&bytes)
                .with_context(|| format!("{} does not parse", serving_file.display()))?;
            Some(handed)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!("not prepared yet: the VM API answers 503 until preparation hands over");
            None
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", serving_file.display())),
    };
    let service = vms.as_ref().map(|handed| {
        std::sync::Arc::new(byo_agent::serve::VmService {
            config: byo_agent::vms::VmConfig {
                ssh_listen: handed.ssh_listen.clone(),
                gpu: handed.gpu,
            },
            relay: Box::new(byo_agent::vms::HttpRelayMap::new(
                &handed.ssh_map_endpoint,
                &handed.ssh_map_token,
            )),
            host: std::sync::Mutex::new(byo_agent::host::LocalHost::default()),
        })
    });
    let state = byo_agent::serve::Serving {
        vms: service.clone(),
        token_hash: std::sync::Arc::new(byo_core::tokens::TokenHash::from_stored(
            hash.to_ascii_lowercase(),
        )),
        operator_keys,
    };
    // One thread: the agent's steady state is to answer the backend and otherwise sit still.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        tracing::info!(%listen, "serving");
        if let (Some(svc), Some(handed)) = (service, vms) {
            std::thread::spawn(move || byo_agent::heartbeat::run(svc, handed, heartbeat_every));
        }
        axum::serve(listener, byo_agent::serve::router(state))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        Ok(())
    })
}

fn enroll(
    server: &str,
    token: Option<String>,
    token_file: Option<PathBuf>,
    root: PathBuf,
) -> anyhow::Result<()> {
    use byo_agent::enroll::{EnrolOutcome, EnrolPaths, Enroller, read_token};
    let enroller = Enroller::new(server, EnrolPaths { root });
    let token = if enroller.kept()?.is_some() {
        String::new()
    } else {
        read_token(token.as_deref(), token_file.as_deref())
            .context("reading the enrolment token")?
    };
    match enrol_this_machine(&enroller, &token)?? {
        EnrolOutcome::Enrolled { slug } => println!("enrolled as {slug}"),
        EnrolOutcome::AlreadyEnrolled { slug } => {
            println!("already enrolled as {slug}; reusing its credentials")
        }
    }
    Ok(())
}

/// Detect this machine (step 126) and redeem `token`, retrying while the backend is away.
fn enrol_this_machine(
    enroller: &byo_agent::enroll::Enroller,
    token: &str,
) -> anyhow::Result<Result<byo_agent::enroll::EnrolOutcome, byo_agent::enroll::EnrolError>> {
    let report = byo_wire::enroll::EnrollRequest {
        node: byo_agent::detect::detect(&byo_agent::detect::LocalProbe),
        peers: Vec::new(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(rt.block_on(enroller.enrol(token, &report)))
}

fn prepare(root: PathBuf, dry_run: bool) -> anyhow::Result<()> {
    use byo_agent::enroll::{EnrolError, EnrolOutcome, EnrolPaths, Enroller};
    use byo_agent::prepare::{self, Serving};
    use byo_core::prepare::Mode;
    let mut host = byo_agent::host::LocalHost {
        root: root.clone(),
        ..Default::default()
    };
    if prepare::handed_over(&mut host).map_err(anyhow::Error::msg)? && !dry_run {
        println!("preparation completed earlier; nothing to do");
        return Ok(());
    }
    let etc = root.join("etc/enverge");
    let server = std::fs::read_to_string(etc.join("server"))
        .ok()
        .map(|s| s.trim().to_owned());
    let enroller = Enroller::new(
        server.as_deref().unwrap_or_default(),
        EnrolPaths { root: root.clone() },
    );
    if enroller.kept()?.is_none() {
        server
            .as_deref()
            .context("reading /etc/enverge/server (run install.sh)")?;
        let token_file = etc.join("enrol-token");
        let token = std::fs::read_to_string(&token_file).unwrap_or_default();
        let outcome = enrol_this_machine(&enroller, &token)?;
        // A token is good for one answer: spent on success, worthless after a refusal.
        if matches!(
            outcome,
            Ok(EnrolOutcome::Enrolled { .. })
                | Err(EnrolError::InvalidToken(_) | EnrolError::Rejected(_))
        ) {
            let _ = std::fs::remove_file(&token_file);
        }
        let (EnrolOutcome::Enrolled { slug } | EnrolOutcome::AlreadyEnrolled { slug }) = outcome?;
        println!("enrolled as {slug}");
    }
    let creds = enroller
        .kept()?
        .context("no credentials were kept by enrolment")?;
    let keys = enroller.operator_keys(&creds.environment);
    let authorized_keys = keys.held()?.map(|(_, list)| list.authorized_keys());
    let mut plan = prepare::plan_from(&creds, authorized_keys).map_err(anyhow::Error::msg)?;
    let build = prepare::build_id();
    let reporter = match &server {
        Some(s) if !dry_run => Some(
            byo_agent::report::Reporter::new(s, &creds.host_token).map_err(anyhow::Error::msg)?,
        ),
        _ => None,
    };
    // node0's steps and the satellites' (run inside the satellites step) report alike.
    let reporter = std::rc::Rc::new(std::cell::RefCell::new(reporter));
    let emit = {
        let reporter = reporter.clone();
        move |p: &byo_core::prepare::Progress| {
            let s = &p.state;
            match &s.error {
                Some(e) => println!("  node{} {:<16} {:?}: {e}", p.node, s.step, s.state),
                None => println!("  node{} {:<16} {:?}", p.node, s.step, s.state),
            }
            if let Some(r) = reporter.borrow_mut().as_mut() {
                r.send_or_log(&byo_wire::prepare::HostReport {
                    node: p.node,
                    state: p.state.clone(),
                    completed: false,
                });
            }
        }
    };
    let emit = std::rc::Rc::new(emit);
    if plan.profile.node_count > 1 {
        let peers = std::fs::read_to_string(etc.join("peer.json"))
            .context("reading /etc/enverge/peer.json (the satellites found at enrolment)")?;
        plan.peers = prepare::peers::parse_peer_file(&peers).map_err(anyhow::Error::msg)?;
        plan.peer_public_key = std::fs::read_to_string(etc.join("peer.key.pub")).ok();
        let sink = emit.clone();
        plan.satellites = Some(std::rc::Rc::new(prepare::peers::SshSatellites {
            dir: etc.clone(),
            lxd_socket: if plan.profile.prepare.lxd == byo_wire::profile::LxdSource::Apt {
                "/var/lib/lxd/unix.socket".into()
            } else {
                "/var/snap/lxd/common/lxd/unix.socket".into()
            },
            report: Box::new(move |p| sink(&p)),
        }));
    }
    let mode = if dry_run { Mode::DryRun } else { Mode::Run };
    println!(
        "preparing {} as {build}{}",
        creds.slug,
        if dry_run {
            " (dry run: checks only)"
        } else {
            ""
        }
    );
    let mut last = None;
    let started = std::time::Instant::now();
    let outcome = prepare::run(&mut host, &plan, 0, &build, mode, chrono::Utc::now, |p| {
        emit(&p);
        last = Some(p);
    });
    println!(
        "took {} ms, {} programs run",
        started.elapsed().as_millis(),
        host.spawned
    );
    if dry_run {
        if outcome.changes.is_empty() {
            println!("nothing would change: this host is prepared");
        } else {
            println!("would change:");
            for (step, what) in &outcome.changes {
                println!("  {step}: {what}");
            }
        }
        return Ok(());
    }
    if !outcome.changes.is_empty() {
        println!("changed:");
        for (step, what) in &outcome.changes {
            println!("  {step}: {what}");
        }
    }
    if let Some((step, error)) = outcome.failed {
        anyhow::bail!("preparation stopped at {step}: {error}");
    }
    prepare::hand_over(
        &mut host,
        &Serving {
            host_id: creds.host_id.clone(),
            slug: creds.slug.clone(),
            server: server.clone().unwrap_or_default(),
            host_token: creds.host_token.clone(),
            ssh_map_endpoint: creds.ssh_map_endpoint.clone(),
            ssh_map_token: creds.ssh_map_token.clone(),
            ssh_listen: creds
                .wireguard
                .address
                .split('/')
                .next()
                .unwrap_or("10.8.0.2")
                .to_owned(),
            gpu: plan.profile.gpu_count.unwrap_or(0) > 0,
            build,
        },
    )
    .map_err(anyhow::Error::msg)?;
    if let (Some(r), Some(p)) = (reporter.borrow_mut().as_mut(), last) {
        r.send_or_log(&byo_wire::prepare::HostReport {
            node: p.node,
            state: p.state,
            completed: true,
        });
    }
    println!("prepared: the credentials are handed to serving");
    Ok(())
}

fn rollback(bin: &std::path::Path) -> anyhow::Result<()> {
    use sha2::{Digest, Sha256};
    let mut previous = bin.as_os_str().to_owned();
    previous.push(".previous");
    let previous = PathBuf::from(previous);
    let digest = |p: &std::path::Path| std::fs::read(p).map(|b| Sha256::digest(&b));
    let old = digest(&previous)
        .with_context(|| format!("no previous build at {}", previous.display()))?;
    let now = digest(bin).with_context(|| format!("reading {}", bin.display()))?;
    if old == now {
        std::fs::remove_file(&previous)?;
        anyhow::bail!(
            "the previous build is the one already running; not restoring it (the host stays down and is alerted)"
        );
    }
    // Consumed: a second failure finds nothing to go back to.
    std::fs::rename(&previous, bin).with_context(|| format!("restoring {}", previous.display()))?;
    println!("restored the previous build at {}", bin.display());
    let _ = std::process::Command::new("systemctl")
        .args(["--no-block", "restart", byo_agent::units::SERVING])
        .status();
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let cmd = match cli.command {
        Command::Serve {
            listen,
            agent_token_hash,
            serving_file,
            heartbeat_every,
            paths,
        } => {
            return serve(
                listen,
                agent_token_hash,
                serving_file,
                heartbeat_every,
                paths,
            );
        }
        Command::OperatorKeys(cmd) => cmd,
        Command::Enroll {
            server,
            token,
            token_file,
            root,
        } => return enroll(&server, token, token_file, root),
        Command::Prepare { root, dry_run } => return prepare(root, dry_run),
        Command::Rollback { bin } => return rollback(&bin),
    };
    match cmd {
        KeysCommand::Apply { file, paths } => {
            let mut bytes = Vec::new();
            if file.as_os_str() == "-" {
                std::io::stdin().read_to_end(&mut bytes)?;
            } else {
                bytes =
                    std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            }
            let applied = keys(paths).receive(&bytes, chrono::Utc::now())?;
            println!(
                "applied operator-key list version {} ({} keys)",
                applied.version, applied.keys
            );
        }
        KeysCommand::Reconcile { paths } => {
            if keys(paths).reconcile()? {
                println!("authorized_keys rewritten from the kept list");
            }
        }
        KeysCommand::Trust { key, paths } => {
            keys(paths).trust(&key)?;
            println!("signing key pinned; send the list again from /admin");
        }
        KeysCommand::Show { paths } => match keys(paths).held()? {
            None => println!("no list is kept on this host"),
            Some((_, list)) => {
                println!(
                    "version {} for {}, expires {}",
                    list.version,
                    escape_control(&list.environment),
                    list.expires
                );
                for k in &list.keys {
                    let fp = check_key(k)
                        .map(|c| c.fingerprint)
                        .unwrap_or_else(|e| format!("invalid: {e}"));
                    println!(
                        "  {fp}  {} ({})",
                        escape_control(&k.user_sub),
                        escape_control(&k.label)
                    );
                }
            }
        },
    }
    Ok(())
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
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("byo-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}
