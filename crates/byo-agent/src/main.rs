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

fn run(cli: Cli) -> anyhow::Result<()> {
    let Command::OperatorKeys(cmd) = cli.command;
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
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("byo-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}
